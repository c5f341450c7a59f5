"""Collective speed and configure latency: raw torch Gloo vs our Gloo vs our BabyGloo.

Two processes on 127.0.0.1 run allreduce at 4 KiB, 256 KiB, 4 MiB and 64 MiB,
alternating the three variants op by op (taking them in each of their six
orders in turn, so none always follows the Baby child's work or leads after
a barrier) so machine noise hits all of them alike; then `configure`
latency over repeated reconfigurations at world sizes 2 and 4, each after the
previous backend's teardown (as a job, which reconfigures seconds apart, sees
it) and back to back (a storm, where the bounded teardown queue makes
configures wait). Prints a table and, last, one JSON line with ratios to raw
Gloo measured in the same run.

    .venv/bin/python bench/collectives.py [--quick] [--torchft-python PATH]
    .venv/bin/python bench/collectives.py --allreduce-only --sizes 4KiB,256KiB,4MiB --repeat 3

The allreduce comparison is made as several independent runs (``--repeat``,
new processes each; 3 by default), each round of a run on new groups of each
kind: on this VM one Gloo group can run 10-20% apart from another for as long
as it lives (two raw Gloo groups differ as much), so neither one run nor one
set of groups gives the figure. The second form runs only that comparison,
over the sizes named.

The guard: each round pairs our Gloo's median op time with raw Gloo's from
the same interleaved ops; over every paired round of every run, the median
of ``ours / raw`` must stay within ``--max-gloo-ratio`` (1.10 by default:
the target is 1.05, the rest is this loaded machine's noise) at each size,
else the benchmark names the size, the ratio and the bound and exits 1
(``--quick`` reports the ratios without judging them).

With ``--torchft-python PATH`` (or ``TORCHFT_PYTHON``), a python that has the
real torchft installed, each run also starts two processes of that python
(``bench/_collectives_torchft.py``, nothing of this checkout on their path)
that measure torchft's own ``ProcessGroupGloo`` and ``ProcessGroupBabyGloo``
the same way: alternated op by op with raw torch Gloo, in every order in turn,
on new groups every round. Their rounds take turns with ours (our round, then
theirs, and so on), so load on the machine falls on both. Each side's ratios
are to the raw Gloo measured in its own processes: a second table per run,
``torchft_*`` keys per size in the JSON line (``torchft_gloo_vs_raw``,
``torchft_baby_extra_us``, ...), and, pooled over the runs as the guard pools
ours, torchft's Gloo / raw and BabyGloo extra over raw beside ours (JSON key
``torchft``). The guard judges ours only. Without it torchft is not run, and
one line says so.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import IO, Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._collectives_torchft import TURN_TIMEOUT, Turns, interleaved_round, release
from tests.multiproc import RankContext, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {"4KiB": 4 << 10, "256KiB": 256 << 10, "4MiB": 4 << 20, "64MiB": 64 << 20}
ITERS = {"4KiB": 300, "256KiB": 60, "4MiB": 12, "64MiB": 3}
BABY_TEARDOWN_PAUSE_S = 0.1  # see _configure_latency
MAX_GLOO_RATIO = 1.10  # our Gloo's allreduce time over raw Gloo's, at most (see the module doc)
TORCHFT_WORKER = os.path.join(ROOT, "bench", "_collectives_torchft.py")
RUN_TIMEOUT_S = 600  # one run of the allreduce comparison; twice that with torchft's turns


def _iters(size_name: str, quick: bool) -> int:
    return max(1, ITERS[size_name] // (4 if quick else 1))


def _allreduce_rounds(ctx: RankContext) -> dict[str, dict[str, list[float]]]:
    import torch
    import torch.distributed as dist

    from torchft_pg import ProcessGroupBabyGloo, ProcessGroupGloo
    from torchft_pg.process_group import _reaper

    rounds, quick, sizes, turn_port = ctx.args
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("raw", ctx.store),
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=60),
    )
    ours = ProcessGroupGloo(timeout=timedelta(seconds=60))
    baby = ProcessGroupBabyGloo(timeout=timedelta(seconds=60), warm_spare=False)
    raw: list[Any] = []  # this round's raw torch Gloo group
    # torchft's rounds (run in its own processes) take turns with these, if it runs
    turns = (
        None
        if turn_port is None
        else Turns(
            dist.TCPStore("127.0.0.1", turn_port, is_master=False, timeout=TURN_TIMEOUT),
            "ours",
            ctx.rank,
            ctx.world_size,
        )
    )

    def fresh_groups(tag: str) -> None:
        """New groups of each kind for a round. A Gloo group's threads can sit in
        a slow spot of this loaded 2-core host for as long as the group lives
        (10-20% apart, two raw groups alike): with new groups every round, that
        luck is drawn again each round and the median over rounds evens it out,
        where with one group per run it decided the run."""
        if raw:
            dist.destroy_process_group(raw.pop())
        raw.append(dist.new_group(backend="gloo", timeout=timedelta(seconds=60)))
        ours.configure(ctx.addr(f"ours/{tag}"), ctx.rank, ctx.world_size)
        baby.configure(ctx.addr(f"baby/{tag}"), ctx.rank, ctx.world_size)
        _reaper.wait_idle(30.0)  # the previous backend's teardown is not in the round

    variants: dict[str, Callable[[Any], object]] = {
        "raw": lambda t: dist.all_reduce(t, group=raw[0]),
        "gloo": lambda t: ours.allreduce([t]).wait(),
        "baby": lambda t: baby.allreduce([t]).wait(),
    }
    out: dict[str, dict[str, list[float]]] = {v: {s: [] for s in sizes} for v in variants}
    j = 0  # the round's index over all sizes, for the turns
    for size_name in sizes:
        t = torch.ones(SIZES[size_name] // 4)
        for r in range(rounds):
            if turns is not None:
                turns.before(j)
            fresh_groups(f"{size_name}/{r}")
            for fn in variants.values():  # warm-up (first use moves the Baby tensor to shm)
                fn(t)
            ctx.barrier(f"{size_name}/{r}")
            # Alternate op by op: each variant's samples see the same machine state.
            for name, med in interleaved_round(variants, t, _iters(size_name, quick)).items():
                out[name][size_name].append(med)
            if turns is not None:
                turns.after(j)
            j += 1
    baby.shutdown()
    ours.shutdown()
    dist.destroy_process_group()
    return out


def _op_cost(ctx: RankContext) -> dict[str, float]:
    """Per-op cost of each variant in one process (world size 1): no peer, no network,
    so what remains is each path's own overhead, measured deterministically."""
    import torch
    import torch.distributed as dist

    from torchft_pg import ProcessGroupBabyGloo, ProcessGroupGloo

    dist.init_process_group("gloo", store=dist.PrefixStore("raw1", ctx.store), rank=0, world_size=1)
    ours = ProcessGroupGloo(timeout=timedelta(seconds=60))
    ours.configure(ctx.addr("ours1"), 0, 1)
    baby = ProcessGroupBabyGloo(timeout=timedelta(seconds=60), warm_spare=False)
    baby.configure(ctx.addr("baby1"), 0, 1)
    t = torch.ones(1024)
    variants = {
        "raw": lambda: dist.all_reduce(t),
        "gloo": lambda: ours.allreduce([t]).wait(),
        "baby": lambda: baby.allreduce([t]).wait(),
    }
    for fn in variants.values():
        for _ in range(200):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(7):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(500):
                fn()
            samples[name].append((time.perf_counter() - start) / 500)
    baby.shutdown()
    ours.shutdown()
    dist.destroy_process_group()
    return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def _configure_latency(ctx: RankContext) -> dict[str, list[float]]:
    from torchft_pg import ProcessGroupBabyGloo, ProcessGroupGloo
    from torchft_pg.process_group import _reaper

    kind, count, storm = ctx.args
    pg: Any = (
        ProcessGroupGloo(timeout=timedelta(seconds=30))
        if kind == "gloo"
        else ProcessGroupBabyGloo(timeout=timedelta(seconds=30), warm_spare=False)
    )
    import torch

    pg.configure(ctx.addr(f"{kind}/warm"), ctx.rank, ctx.world_size)  # first: child start-up
    times = []
    for i in range(count):
        if not storm:  # a job reconfigures seconds apart: the last teardown is done
            _reaper.wait_idle(30.0)
            if kind == "baby":
                # A Baby group's old backend is torn down by its child's own reaper,
                # which this process cannot ask; a Gloo teardown takes ~20 ms, so a
                # pause of several teardowns stands for "seconds apart" there.
                time.sleep(BABY_TEARDOWN_PAUSE_S)
        ctx.barrier(f"cfg/{kind}/{i}")
        start = time.perf_counter()
        pg.configure(ctx.addr(f"{kind}/{i}"), ctx.rank, ctx.world_size)
        times.append(time.perf_counter() - start)
        pg.allreduce([torch.ones(1)]).wait()  # the new group really works
    pg.shutdown()
    return {"times": times}


class _TorchftSide:
    """torchft's two processes for one run (``python`` ``TORCHFT_WORKER``), whose rounds
    take turns with ours on the store at ``port``. A thread reads their output until
    each has printed its result or exited, stops the other by its pid when one fails
    (it would wait for its peer until a timeout), and then sets every key of their
    turns, so our ranks never wait on processes that are gone."""

    def __init__(
        self, python: str, port: int, rounds: int, quick: bool, sizes: list[str], timeout: float
    ) -> None:
        self._port = port
        self._turns = rounds * len(sizes)
        self._timeout = timeout
        # their stderr, for the error line; closed in finish()
        self._errs: list[IO[bytes]] = [tempfile.TemporaryFile() for _ in range(2)]  # noqa: SIM115
        self.results: list[dict[str, Any] | None] = [None, None]
        # no PYTHONPATH (it may name this checkout): torchft's processes import torchft only
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(2):
            cfg = {
                "rank": rank,
                "world_size": 2,
                "port": port,
                "rounds": rounds,
                "sizes": {s: SIZES[s] for s in sizes},
                "iters": {s: _iters(s, quick) for s in sizes},
            }
            self.procs.append(
                subprocess.Popen(
                    [python, TORCHFT_WORKER, json.dumps(cfg)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=self._errs[rank],
                    env=env,
                )
            )
        self._thread = threading.Thread(target=self._watch, name="torchft-side", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        from torch.distributed import TCPStore

        deadline = time.monotonic() + self._timeout
        bufs = [b"", b""]
        sel = selectors.DefaultSelector()
        for rank, p in enumerate(self.procs):
            assert p.stdout is not None
            sel.register(p.stdout, selectors.EVENT_READ, rank)
        try:
            while sel.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    rank = key.data
                    chunk = os.read(key.fd, 65536)
                    bufs[rank] += chunk
                    lines = [x for x in bufs[rank].split(b"\n") if x.startswith(b"{")]
                    done = False
                    if lines and bufs[rank].endswith(b"\n"):
                        try:
                            self.results[rank] = json.loads(lines[-1])
                            done = True
                        except ValueError:  # a line of output, not its result
                            pass
                    if chunk and not done:
                        continue
                    # its result, or EOF without one: this rank is over
                    sel.unregister(key.fileobj)
                    result = self.results[rank]
                    if result is None or "error" in result:  # its peer would wait for it
                        for p in self.procs:
                            if p.poll() is None:
                                p.kill()  # by its own pid
        finally:
            sel.close()
            for p in self.procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()  # by its own pid
                    p.wait(timeout=10)
            store = TCPStore("127.0.0.1", self._port, is_master=False, timeout=TURN_TIMEOUT)
            release(store, "torchft", self._turns, 2)

    def finish(self) -> dict[str, Any]:
        """Rank 0's result once both processes are over (every wait bounded): its
        rounds and torchft's version, or ``{"error": ...}``."""
        self._thread.join(timeout=self._timeout + 60)
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # by its own pid
                p.wait(timeout=10)
        for p in self.procs:
            assert p.stdout is not None
            p.stdout.close()
        # the ranks' own errors, or else why each gave no result (a rank stopped
        # after its peer's error gives none, and is not named then)
        errors = [
            f"rank {r}: {x['error']}" for r, x in enumerate(self.results) if x and "error" in x
        ]
        if not errors:
            for rank, (p, result) in enumerate(zip(self.procs, self.results, strict=True)):
                if result is None:
                    self._errs[rank].seek(0)
                    tail = self._errs[rank].read().decode(errors="replace").strip().splitlines()
                    errors.append(
                        f"rank {rank}: no result (exit code {p.returncode}): "
                        + " | ".join(tail[-2:])
                    )
        for f in self._errs:
            f.close()
        first = self.results[0]
        if errors or first is None:
            return {"error": "; ".join(errors)[:400]}
        return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument(
        "--sizes",
        default=",".join(SIZES),
        help=f"comma-separated allreduce sizes, from {', '.join(SIZES)} (default: all)",
    )
    parser.add_argument(
        "--allreduce-only",
        action="store_true",
        help="only the 2-process allreduce comparison (no per-op cost, no configure rows)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="independent runs of the allreduce comparison (default 3: the guard pools them)",
    )
    parser.add_argument(
        "--max-gloo-ratio",
        type=float,
        default=MAX_GLOO_RATIO,
        help="exit 1 if our Gloo's allreduce time over raw Gloo's (median of the paired "
        f"rounds of every run) exceeds this at any size (default {MAX_GLOO_RATIO})",
    )
    parser.add_argument(
        "--torchft-python",
        default=os.environ.get("TORCHFT_PYTHON"),
        metavar="PATH",
        help="a python with torchft installed: also run torchft's Gloo and BabyGloo in this "
        "run (env TORCHFT_PYTHON)",
    )
    args = parser.parse_args()
    tft: str | None = args.torchft_python or None
    if tft is not None and not (os.path.isfile(tft) and os.access(tft, os.X_OK)):
        parser.error(f"--torchft-python {tft}: not an executable file")
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or not sizes:
        parser.error(f"--sizes {args.sizes!r}: expected names from {', '.join(SIZES)}")
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: expected at least 1")
    if not args.max_gloo_ratio > 0:
        parser.error(f"--max-gloo-ratio {args.max_gloo_ratio}: expected a positive ratio")
    if not args.allreduce_only and sizes != list(SIZES):
        parser.error(
            f"--sizes {args.sizes!r}: the full run measures every size (or pass --allreduce-only)"
        )
    rounds = 2 if args.quick else 5
    reconfigs = 20 if args.quick else 100

    runs: list[dict[str, Any]] = []
    torchft_runs: list[dict[str, str]] = []  # per run: torchft's version, or its error
    for _ in range(args.repeat):
        run, theirs = _allreduce_report(rounds, args.quick, sizes, tft)
        runs.append(run)
        if theirs is not None:
            torchft_runs.append(theirs)
    report: dict[str, Any] = {"allreduce": runs[-1]}
    if args.repeat > 1:
        report["allreduce_runs"] = runs
        print(
            f"\nper run ({args.repeat} runs): extra over raw Gloo, each the median of its rounds;"
        )
        print("our Gloo / raw Gloo, each the median of its paired rounds")
        for s in sizes:
            gloo = [round(r[s]["gloo_extra_us"]) for r in runs]
            baby = [round(r[s]["baby_extra_us"]) for r in runs]
            ratios = [round(r[s]["gloo_vs_raw"], 2) for r in runs]
            print(
                f"{s:>8}: Gloo {gloo} us (median {statistics.median(gloo):.0f}); "
                f"BabyGloo {baby} us (median {statistics.median(baby):.0f}); "
                f"Gloo/raw {ratios} (median {statistics.median(ratios):.2f}x)"
            )
            with_tft = [r[s] for r in runs if "torchft_gloo_vs_raw" in r[s]]
            if with_tft:
                tbaby = [round(r["torchft_baby_extra_us"]) for r in with_tft]
                tratios = [round(r["torchft_gloo_vs_raw"], 2) for r in with_tft]
                print(f"{'':>8}  torchft: BabyGloo {tbaby} us; Gloo/raw {tratios}")
    guard = _gloo_guard(runs, sizes, args.max_gloo_ratio)
    report["gloo_guard"] = guard
    if tft is None:
        print(
            "torchft not measured in this run: pass --torchft-python PATH or set "
            "TORCHFT_PYTHON to a python with torchft installed"
        )
    else:
        ok = [r for r in torchft_runs if "error" not in r]
        errors = [r["error"] for r in torchft_runs if "error" in r]
        report["torchft"] = {
            "python": tft,
            "version": ok[0]["version"] if ok else "?",
            "module": ok[0]["module"] if ok else "?",
            **_torchft_beside_ours(runs, sizes, guard, errors),
        }
    if not args.allreduce_only:
        _op_cost_and_configure(report, reconfigs)
    print()
    print(json.dumps({"bench": "collectives", **report}))
    if args.quick:  # a smoke run: too few ops to judge a 10% difference on a loaded host
        print("(--quick: our Gloo's ratio to raw Gloo is reported, not judged)", file=sys.stderr)
        return
    failed = [s for s in sizes if guard["ratio"][s] > guard["bound"]]
    for s in failed:
        print(
            f"FAIL: torchft_pg ProcessGroupGloo allreduce at {s} takes {guard['ratio'][s]:.3f}x "
            f"raw torch Gloo's time (median of {guard['paired_rounds']} paired rounds), "
            f"above the bound {guard['bound']:.2f}x",
            file=sys.stderr,
        )
    if failed:
        sys.exit(1)


def _gloo_guard(runs: list[dict[str, Any]], sizes: list[str], bound: float) -> dict[str, Any]:
    """Our Gloo's time over raw Gloo's per size: the median over the paired rounds of
    every run (pooled, so one noisy run moves it less than its own median would)."""
    ratio = {
        s: statistics.median(x for r in runs for x in r[s]["gloo_vs_raw_rounds"]) for s in sizes
    }
    paired = len(runs[0][sizes[0]]["gloo_vs_raw_rounds"]) * len(runs)
    print(
        f"\nour Gloo / raw Gloo allreduce time, median of {paired} paired rounds "
        f"(bound {bound:.2f}x): "
        + ", ".join(f"{s} {ratio[s]:.3f}x{'' if ratio[s] <= bound else ' OVER'}" for s in sizes)
    )
    return {"ratio": ratio, "bound": bound, "paired_rounds": paired}


def _allreduce_report(
    rounds: int, quick: bool, sizes: list[str], tft: str | None
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """One run of the 2-process allreduce comparison (new processes): prints its table
    and returns, per size, each variant's median time, its ratios to raw Gloo, and
    our Gloo's time over raw Gloo's in each round (the two measured op by op); with
    ``tft``, torchft's two processes run their own rounds in turn with ours, and
    their figures (``torchft_*``, each against their own raw Gloo) join each size's.
    Second, with ``tft``: torchft's ``version`` and ``module`` directory, or ``error``
    (why its side gave no figures)."""
    theirs: dict[str, Any] | None = None
    if tft is None:
        r0 = run_ranks(_allreduce_rounds, 2, rounds, quick, sizes, None, timeout=RUN_TIMEOUT_S)[0]
    else:
        from torch.distributed import TCPStore

        store = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TURN_TIMEOUT
        )
        side = _TorchftSide(tft, store.port, rounds, quick, sizes, 2 * RUN_TIMEOUT_S)
        try:
            r0 = run_ranks(
                _allreduce_rounds, 2, rounds, quick, sizes, store.port, timeout=2 * RUN_TIMEOUT_S
            )[0]
        finally:
            release(store, "ours", rounds * len(sizes), 2)  # torchft's never wait on ours
            theirs = side.finish()
    med = {v: {s: statistics.median(r0[v][s]) for s in sizes} for v in r0}
    paired = {
        v: {s: [a / b for a, b in zip(r0[v][s], r0["raw"][s], strict=True)] for s in sizes}
        for v in ("gloo", "baby")
    }
    print(
        f"\nallreduce, 2 processes on 127.0.0.1 (median of {rounds} rounds; "
        "bus GB/s = 2(n-1)/n * bytes / t; (x raw): time over raw Gloo's, median of the "
        "paired rounds)"
    )
    _table(("raw gloo", "torchft_pg Gloo", "torchft_pg BabyGloo"), sizes, med, paired)
    out: dict[str, Any] = {}
    for s in sizes:
        out[s] = {
            "raw_ms": med["raw"][s] * 1e3,
            "gloo_ms": med["gloo"][s] * 1e3,
            "baby_ms": med["baby"][s] * 1e3,
            "gloo_bw_ratio": med["raw"][s] / med["gloo"][s],
            "baby_bw_ratio": med["raw"][s] / med["baby"][s],
            "gloo_vs_raw": statistics.median(paired["gloo"][s]),
            "baby_vs_raw": statistics.median(paired["baby"][s]),
            "gloo_vs_raw_rounds": paired["gloo"][s],
            "gloo_extra_us": (med["gloo"][s] - med["raw"][s]) * 1e6,
            "baby_extra_us": (med["baby"][s] - med["raw"][s]) * 1e6,
        }
    if theirs is None:
        return out, None
    if "error" in theirs:
        print(f"torchft: no figures in this run: {theirs['error']}")
        return out, {"error": str(theirs["error"])}
    t0: dict[str, dict[str, list[float]]] = theirs["rounds"]
    tmed = {v: {s: statistics.median(t0[v][s]) for s in sizes} for v in t0}
    tpaired = {
        v: {s: [a / b for a, b in zip(t0[v][s], t0["raw"][s], strict=True)] for s in sizes}
        for v in ("gloo", "baby")
    }
    print(
        f"torchft's groups in their own 2 processes ({theirs['version']}), against raw Gloo "
        "measured with them, their rounds taking turns with the ones above"
    )
    _table(("raw gloo", "torchft Gloo", "torchft BabyGloo"), sizes, tmed, tpaired)
    for s in sizes:
        out[s].update(
            {
                "torchft_raw_ms": tmed["raw"][s] * 1e3,
                "torchft_gloo_ms": tmed["gloo"][s] * 1e3,
                "torchft_baby_ms": tmed["baby"][s] * 1e3,
                "torchft_gloo_vs_raw": statistics.median(tpaired["gloo"][s]),
                "torchft_baby_vs_raw": statistics.median(tpaired["baby"][s]),
                "torchft_gloo_vs_raw_rounds": tpaired["gloo"][s],
                "torchft_gloo_extra_us": (tmed["gloo"][s] - tmed["raw"][s]) * 1e6,
                "torchft_baby_extra_us": (tmed["baby"][s] - tmed["raw"][s]) * 1e6,
            }
        )
    return out, {"version": str(theirs["version"]), "module": str(theirs["module"])}


def _table(
    names: tuple[str, str, str],
    sizes: list[str],
    med: dict[str, dict[str, float]],
    paired: dict[str, dict[str, list[float]]],
) -> None:
    """Rows of raw Gloo and two groups: median ms, bus GB/s, time over raw Gloo's."""
    print(f"{'size':>8} | {names[0]:>18} | {names[1]:>28} | {names[2]:>28}")
    for s in sizes:
        cells = []
        for v in ("raw", "gloo", "baby"):
            t = med[v][s]
            gbps = SIZES[s] / t / 1e9  # 2(n-1)/n == 1 for n = 2
            ratio = "" if v == "raw" else f" ({statistics.median(paired[v][s]):5.2f}x raw)"
            cells.append(f"{t * 1e3:8.3f} ms {gbps:5.2f}{ratio}")
        print(f"{s:>8} | {cells[0]:>18} | {cells[1]:>28} | {cells[2]:>28}")


def _torchft_beside_ours(
    runs: list[dict[str, Any]], sizes: list[str], guard: dict[str, Any], errors: list[str]
) -> dict[str, Any]:
    """torchft's Gloo over its raw Gloo (pooled paired rounds, as the guard pools ours)
    and its BabyGloo's extra over raw Gloo (median over runs), beside ours."""
    done = [r for r in runs if "torchft_gloo_vs_raw_rounds" in r[sizes[0]]]
    fields: dict[str, Any] = {"runs": len(done), "errors": errors}
    if not done:
        return fields
    ratio = {
        s: statistics.median(x for r in done for x in r[s]["torchft_gloo_vs_raw_rounds"])
        for s in sizes
    }
    baby = {s: statistics.median(r[s]["torchft_baby_extra_us"] for r in done) for s in sizes}
    ours_baby = {s: statistics.median(r[s]["baby_extra_us"] for r in done) for s in sizes}
    paired = len(done[0][sizes[0]]["torchft_gloo_vs_raw_rounds"]) * len(done)
    print(
        f"\nbeside torchft ({len(done)} of {len(runs)} runs with torchft's figures): Gloo / raw "
        f"Gloo, median of {paired} paired rounds each; BabyGloo extra over raw Gloo, median "
        "over runs"
    )
    print(
        f"{'size':>8} | {'Gloo/raw ours':>13} {'torchft':>8} | "
        f"{'BabyGloo extra ours':>19} {'torchft':>10}"
    )
    for s in sizes:
        print(
            f"{s:>8} | {guard['ratio'][s]:12.3f}x {ratio[s]:7.3f}x | "
            f"{ours_baby[s]:+16.0f} us {baby[s]:+7.0f} us"
        )
    return {
        **fields,
        "gloo_vs_raw": ratio,
        "paired_rounds": paired,
        "baby_extra_us": baby,
        "ours_baby_extra_us": ours_baby,
    }


def _op_cost_and_configure(report: dict[str, Any], reconfigs: int) -> None:
    """The one-process op cost and the configure rows; then the targets."""
    cost = run_ranks(_op_cost, 1, timeout=300)[0]
    print(
        "\nper-op cost in one process (world size 1, 4 KiB: each path's own overhead, no network)"
    )
    print(
        f"  raw torch.distributed {cost['raw']:7.1f} us   torchft_pg Gloo {cost['gloo']:7.1f} us "
        f"({cost['gloo'] - cost['raw']:+.1f})   BabyGloo {cost['baby']:7.1f} us ({cost['baby'] - cost['raw']:+.1f})"
    )
    report["op_cost_us"] = cost

    print(
        f"\nconfigure latency ({reconfigs} reconfigurations each, max over ranks per configure;"
        "\n  after: each once the previous backend's teardown is done, as in a job;"
        "\n  storm: back to back, each also waiting for a teardown once 8 are queued)"
    )
    print(
        f"{'backend':>10} {'world':>5} {'mode':>6} | {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8} | >1 s"
    )
    report["configure"] = {}
    for kind, world, storm in itertools.product(("gloo", "baby"), (2, 4), (False, True)):
        per_rank = run_ranks(_configure_latency, world, kind, reconfigs, storm, timeout=600)
        worst = [max(r["times"][i] for r in per_rank) for i in range(reconfigs)]
        worst_sorted = sorted(worst)
        p50 = statistics.median(worst) * 1e3
        p90 = worst_sorted[int(0.9 * (len(worst) - 1))] * 1e3
        mx = worst_sorted[-1] * 1e3
        slow = sum(1 for w in worst if w > 1.0)
        mode = "storm" if storm else "after"
        print(f"{kind:>10} {world:>5} {mode:>6} | {p50:8.2f} {p90:8.2f} {mx:8.2f} | {slow}")
        report["configure"][f"{kind}_ws{world}" + ("_storm" if storm else "")] = {
            "p50_ms": p50,
            "p90_ms": p90,
            "max_ms": mx,
            "over_1s": slow,
        }

    small = report["allreduce"]["4KiB"]
    report["targets"] = {
        "gloo_bw_ratio_ge_0.97_at_256KiB_plus": all(
            report["allreduce"][s]["gloo_bw_ratio"] >= 0.97 for s in ("256KiB", "4MiB", "64MiB")
        ),
        "gloo_extra_small_op_le_50us": small["gloo_extra_us"] <= 50,
        "gloo_own_overhead_le_50us": cost["gloo"] - cost["raw"] <= 50,
        "baby_extra_small_op_le_300us": small["baby_extra_us"] <= 300,
        "baby_own_overhead_le_300us": cost["baby"] - cost["raw"] <= 300,
        "baby_bw_ratio_ge_0.9_at_64MiB": report["allreduce"]["64MiB"]["baby_bw_ratio"] >= 0.9,
        "gloo_configure_ws2_le_10ms": report["configure"]["gloo_ws2"]["p50_ms"] <= 10,
        "gloo_configure_ws4_le_25ms": report["configure"]["gloo_ws4"]["p50_ms"] <= 25,
        "baby_configure_le_200ms": max(report["configure"][f"baby_ws{w}"]["p50_ms"] for w in (2, 4))
        <= 200,
        "no_multisecond_outliers": all(c["over_1s"] == 0 for c in report["configure"].values()),
        "gloo_time_le_max_ratio_of_raw": all(
            r <= report["gloo_guard"]["bound"] for r in report["gloo_guard"]["ratio"].values()
        ),
    }


if __name__ == "__main__":
    main()
