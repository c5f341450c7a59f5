"""Manager-level quorum benchmark: ``start_quorum()`` + ``should_commit()`` per step.

N replica processes (one-rank groups, ``ProcessGroupDummy``, no collectives), a
lighthouse with ``min_replicas=N``, 300 steps, with quorum leases on and off.
This is a torchft user's loop that relies on the quorum as the step barrier:
nothing but the quorum keeps the replicas in step, so it checks that leased
rounds keep them aligned and that a replica finishing first strands nobody.

Per scenario: the median step time over all replicas, how many replicas
finished all steps, and the largest step lead any replica had over the slowest
(steps it had finished that the slowest had not begun, from the replicas' step
logs: 0 for a barrier, at most 1 with leases). The plain-torch reference is the same
N processes meeting at a TCPStore barrier each step (torch's own way to keep
processes in step), so ``ratio`` = our median / the barrier's median.

With ``--torchft-python PATH`` (or ``TORCHFT_PYTHON``), a python that has the real
torchft installed, each N also runs the same loop with torchft's lighthouse and
``Manager`` (``ProcessGroupDummy``, the same timeouts and measurement), its lighthouse
and workers started with that python: rows ``torchft``, and ``n16_lease_vs_torchft``
= our N=16 lease median / torchft's, both from this run. Without it torchft is not
run and the N=16 lease median is compared to the recorded TORCHFT_N16_MEDIAN_MS.
``--n 2 4`` runs only those N.

Prints a table and, last, one JSON line. Bounded: a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 300
NS = (2, 4, 8, 16)
JOIN_TIMEOUT_MS = 10_000  # both lighthouses
# our replicas' manager servers listen on loopback only (as the lighthouse here does)
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHFT_BIND_HOST": "127.0.0.1"}
# torchft's processes: its python, not our tree; its Rust side logs each quorum at INFO,
# muted like our lighthouse (logger at ERROR here) unless RUST_LOG is set
TORCHFT_ENV = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "error")}
TORCHFT_N16_MEDIAN_MS = 12.4  # torchft's Manager on this machine type, leases do not exist there
TORCHFT_LIGHTHOUSE_MAX_S = 1800  # a torchft lighthouse left behind stops itself after this


def worker(lighthouse: str, index: int, barrier_port: int, world: int, mode: str) -> None:
    """One replica: STEPS steps, then one JSON line with its step times and finish time."""
    from torch.distributed import TCPStore

    if mode == "barrier":
        times: list[float] = []
        stamps: list[float] = []
        ends: list[float] = []
        store = TCPStore("127.0.0.1", barrier_port, world, False, timedelta(seconds=60))
        for step in range(STEPS):
            stamps.append(time.time())
            t = time.perf_counter()
            if store.add(f"b{step}", 1) == world:  # the last to arrive opens the barrier
                store.set(f"go{step}", "1")
            store.wait([f"go{step}"])
            times.append(time.perf_counter() - t)
            ends.append(time.time())
        print_result(index, times, stamps, ends, "")
        return

    from torchft_pg import ProcessGroupDummy
    from torchft_pg.manager import Manager

    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(ProcessGroupDummy(), **manager_settings(lighthouse, index, group_store.port))
    step_loop(manager, index)


def manager_settings(lighthouse: str, index: int, store_port: int) -> dict[str, Any]:
    """The Manager arguments our replicas and torchft's share (same names in both
    libraries): one-rank groups, a quorum of one suffices, no initial sync."""
    return {
        "rank": 0,
        "world_size": 1,
        "store_addr": "127.0.0.1",
        "store_port": store_port,
        "lighthouse_addr": lighthouse,
        "replica_id": f"r{index}",
        "min_replica_size": 1,
        "quorum_timeout": timedelta(seconds=60),
        "init_sync": False,
    }


def step_loop(manager: Any, index: int) -> None:
    """The measured loop, the same for our Manager and torchft's: STEPS steps of
    ``start_quorum()`` + ``should_commit()``, then one JSON line."""
    times: list[float] = []
    stamps: list[float] = []  # wall clock as each step begins
    ends: list[float] = []  # wall clock as each step's should_commit returns
    error = ""
    try:
        while manager.current_step() < STEPS:
            stamps.append(time.time())
            t = time.perf_counter()
            manager.start_quorum()
            manager.should_commit()
            times.append(time.perf_counter() - t)
            ends.append(time.time())
    except Exception as exc:  # reported, not raised: the parent tabulates failures
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        manager.shutdown()
    print_result(index, times, stamps, ends, error)


def print_result(
    index: int, times: list[float], stamps: list[float], ends: list[float], error: str
) -> None:
    """A worker's one JSON line, the same for every mode: its step times (seconds),
    the wall clock as each step began and ended, and its error ("" if none)."""
    line = {"index": index, "times": times, "stamps": stamps, "ends": ends}
    print(json.dumps({**line, "ok": not error, "error": error}))


def torchft_worker(lighthouse: str, index: int) -> None:
    """One torchft replica (run by the torchft python): the same group as ours, a
    one-rank group with its own TCPStore, torchft's ``ProcessGroupDummy``."""
    from torch.distributed import TCPStore

    try:
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupDummy

        group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            ProcessGroupDummy(0, 1),
            load_state_dict=lambda _: None,  # never called: no replica heals here
            state_dict=lambda: {},
            **manager_settings(lighthouse, index, group_store.port),
        )
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
        print_result(index, [], [], [], error)
        return
    step_loop(manager, index)


def torchft_lighthouse(n: int, join_timeout_ms: int) -> None:
    """torchft's lighthouse (run by the torchft python): prints its address as one JSON
    line, serves until the parent closes our stdin (or TORCHFT_LIGHTHOUSE_MAX_S)."""
    from importlib import metadata

    from torchft.coordination import LighthouseServer

    version = "?"
    for dist in ("torchft-nightly", "torchft"):
        try:
            version = f"{dist} {metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            pass
    # Loopback only, like ours; torchft's address() names the host, which need not
    # resolve to loopback, so the workers are given 127.0.0.1 and its port.
    lh = LighthouseServer(bind="127.0.0.1:0", min_replicas=n, join_timeout_ms=join_timeout_ms)
    try:
        port = lh.address().rstrip("/").rsplit(":", 1)[1]
        address = f"http://127.0.0.1:{port}"
        print(json.dumps({"address": address, "version": version}), flush=True)
        select.select([sys.stdin], [], [], TORCHFT_LIGHTHOUSE_MAX_S)  # EOF: the parent is done
    finally:
        lh.shutdown()


def max_lead(results: list[dict[str, object]]) -> int:
    """The most steps any replica had finished that the slowest had not yet begun
    (from the wall-clock stamps each replica takes as a step begins and as its
    ``should_commit`` returns). A step barrier keeps this at 0: nobody finishes
    step s before everyone has begun it. A quorum lease keeps it at 1: a leased
    round at step s waits until every holder has begun step s - 1, so no replica
    is more than one step ahead of the slowest."""
    events = sorted(
        (stamp, kind, r["index"])
        for r in results
        for kind, key in ((0, "stamps"), (1, "ends"))
        for stamp in r[key]  # type: ignore[attr-defined]
    )
    begun: dict[object, int] = {r["index"]: 0 for r in results}
    finished: dict[object, int] = {r["index"]: 0 for r in results}
    lead = 0
    for _, kind, idx in events:
        if kind == 0:
            begun[idx] += 1
        else:
            finished[idx] += 1
            lead = max(lead, finished[idx] - min(begun.values()))
    return lead


def run(n: int, mode: str) -> dict[str, Any]:
    from torch.distributed import TCPStore

    from lighthouse import LighthouseServer

    lh = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=n,
        join_timeout_ms=JOIN_TIMEOUT_MS,
        quorum_lease=mode == "lease",
    )
    barrier = TCPStore("127.0.0.1", 0, n + 1, True, timedelta(seconds=60), wait_for_workers=False)
    try:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    lh.address(),
                    str(i),
                    str(barrier.port),
                    str(n),
                    mode,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=ENV,
            )
            for i in range(n)
        ]
        return collect(procs)
    finally:
        lh.shutdown()


def run_torchft(n: int, python: str) -> dict[str, Any]:
    """The same N replicas on torchft: its lighthouse and its Manager, all in
    processes of ``python`` (the lighthouse too, stopped by its pid at the end)."""
    with tempfile.TemporaryFile() as lh_err:
        lh = subprocess.Popen(
            [python, __file__, "--torchft-lighthouse", str(n), str(JOIN_TIMEOUT_MS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=lh_err,
            env=TORCHFT_ENV,
        )
        try:
            info = read_json_line(lh, timeout=60)
            if info is None:
                lh_err.seek(0)
                tail = lh_err.read().decode(errors="replace").strip().splitlines()[-3:]
                error = f"torchft lighthouse did not start: {' | '.join(tail)}"[:300]
                return {**collect([]), "errors": [error], "version": "?"}
            procs = [
                subprocess.Popen(
                    [python, __file__, "--torchft-worker", str(info["address"]), str(i)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=TORCHFT_ENV,
                )
                for i in range(n)
            ]
            return {**collect(procs), "version": info.get("version", "?")}
        finally:
            stop(lh)


def read_json_line(p: subprocess.Popen[bytes], timeout: float) -> dict[str, Any] | None:
    """The first stdout line of ``p`` that is a JSON object, waiting at most ``timeout``."""
    assert p.stdout is not None
    fd = p.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:  # it exited
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(b"{"):
                found: dict[str, Any] = json.loads(line)
                return found
    return None


def stop(p: subprocess.Popen[bytes]) -> None:
    """Ask ``p`` to stop (EOF on its stdin), then kill it by its pid; every wait bounded."""
    if p.stdin is not None:
        p.stdin.close()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()  # by its own pid
        p.wait(timeout=10)


def collect(procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    """Each worker's JSON line, summarized: the same numbers for every mode."""
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if lines:
                results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # by its own pid
                p.wait(timeout=10)
    n = len(procs)
    times = [t for r in results for t in r["times"][5:]]  # skip warm-up steps
    finished = sum(1 for r in results if r["ok"] and len(r["times"]) >= STEPS)
    errors = sorted({r.get("error", "") for r in results if not r["ok"]})
    if len(results) < n:
        errors.append(f"{n - len(results)} of {n} workers printed no result")
    return {
        "median_ms": statistics.median(times) * 1000 if times else float("nan"),
        "p90_ms": statistics.quantiles(times, n=10)[-1] * 1000 if len(times) > 10 else float("nan"),
        "finished": finished,
        "max_lead": max_lead(results) if results else -1,
        "errors": errors[:2],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--torchft-python",
        default=os.environ.get("TORCHFT_PYTHON"),
        metavar="PATH",
        help="a python with torchft installed: also run torchft in this run (env TORCHFT_PYTHON)",
    )
    parser.add_argument(
        "--n", type=int, nargs="+", default=list(NS), metavar="N", help="replica counts to run"
    )
    args = parser.parse_args(argv)
    tft: str | None = args.torchft_python
    if tft and not (os.path.isfile(tft) and os.access(tft, os.X_OK)):
        parser.error(f"--torchft-python {tft}: not an executable file")
    if any(n < 1 for n in args.n):
        parser.error("--n: every N must be >= 1")

    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    t0 = time.monotonic()
    print(
        f"{'N':>3} {'mode':<9}{'median ms':>10}{'p90 ms':>9}{'finished':>10}"
        f"{'max lead':>9}{'ratio':>7}"
    )
    modes = ("barrier", "lease", "no_lease", "torchft") if tft else ("barrier", "lease", "no_lease")
    table: dict[str, dict[str, Any]] = {}
    tft_version = None
    for n in args.n:
        base = run(n, "barrier")
        for mode in modes:
            if mode == "barrier":
                r = base
            elif mode == "torchft":
                assert tft is not None
                r = run_torchft(n, tft)
                tft_version = r.pop("version")
            else:
                r = run(n, mode)
            ratio = r["median_ms"] / base["median_ms"] if base["median_ms"] else float("nan")
            table[f"n{n}_{mode}"] = {**r, "ratio": round(ratio, 2)}
            print(
                f"{n:>3} {mode:<9}{r['median_ms']:>10.2f}{r['p90_ms']:>9.2f}"
                f"{int(r['finished']):>7}/{n:<2}{int(r['max_lead']):>9}{ratio:>7.2f}"
            )
            for e in r["errors"]:
                print(f"      error: {e}")
    lease16 = table["n16_lease"]["median_ms"] if "n16_lease" in table else None
    report: dict[str, Any] = {
        "bench": "manager_quorum",
        "steps": STEPS,
        "results": table,
        "torchft_n16_median_ms": TORCHFT_N16_MEDIAN_MS,
    }
    if tft:
        # the reference is torchft measured in this run; the constant stays as recorded
        tft16 = table["n16_torchft"]["median_ms"] if "n16_torchft" in table else None
        report["n16_lease_beats_torchft"] = None
        report["n16_lease_vs_torchft"] = None
        if lease16 is not None and tft16 is not None:
            report["n16_lease_beats_torchft"] = lease16 < tft16
            report["n16_lease_vs_torchft"] = round(lease16 / tft16, 3)
            print(
                f"N=16 this run: lease {lease16:.2f} ms, torchft {tft16:.2f} ms, "
                f"lease/torchft {lease16 / tft16:.2f}"
            )
        report["torchft_reference"] = "same_run"
        report["torchft"] = {"python": tft, "version": tft_version}
    else:
        report["n16_lease_beats_torchft"] = (
            lease16 < TORCHFT_N16_MEDIAN_MS if lease16 is not None else None
        )
        print(
            f"torchft not measured in this run (compared to the recorded "
            f"{TORCHFT_N16_MEDIAN_MS} ms): pass --torchft-python PATH or set TORCHFT_PYTHON "
            "to a python with torchft installed"
        )
    report["wall_s"] = round(time.monotonic() - t0, 1)
    report["cpus"] = os.cpu_count()
    print(json.dumps(report))
    return 0


def _without_our_tree() -> None:
    """torchft's processes import torchft, not anything from this checkout."""
    ours = {ROOT, ROOT / "bench"}
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in ours]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        lighthouse, index, port, world, mode = sys.argv[2:7]
        worker(lighthouse, int(index), int(port), int(world), mode)
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--torchft-worker":
        _without_our_tree()
        torchft_worker(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--torchft-lighthouse":
        _without_our_tree()
        torchft_lighthouse(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
