"""Per-step cost of fault-tolerant DDP over plain torch DDP, and against torchft's.

Two processes train the same MLP with plain torch DDP over Gloo and with
`torchft_pg`'s Manager + DDP (quorum leases on, the default), in short rounds
that rotate between the variants on the same processes: adjacent rounds share
the machine's load, so the median of each round's ratio to its neighbour is
the overhead (wall, and CPU of all of a rank's threads), with a bootstrap 95%
confidence interval over rounds for the wall figures (one run's overhead moves by
several percent on a shared machine: the interval says how far it holds). Models
(``--model``):

* ``tiny``: 64 -> 256 -> 64, batch 64 (a step of a few ms: the fixed cost);
* ``mid``: 256 -> 2048 -> 2048 -> 256, ~5.3 M parameters (~60-100 ms here);
* ``large``: 256 -> 3072 -> 3072 -> 256, ~11 M parameters (~150-200 ms here).

With ``--torchft-python PATH`` (or ``TORCHFT_PYTHON``), a python that has the
real torchft installed, the benchmark runs under that python (this checkout on
its path) and each rank also trains torchft's Manager + DDP in the same
rotation, against torchft's own lighthouse: rows ``torchft`` and the ratio of
ours to torchft's, from the same rounds. Without it, torchft is not run and
the output says so. `--profile` instead runs cProfile over the Manager's steps
on rank 0 and prints where their time went.

    PYTHONPATH=. .venv/bin/python bench/step_overhead.py [--model tiny mid large]
        [--rounds 24] [--steps 4] [--torchft-python PATH] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._proc import process_cpu_s
from bench.ddp_pairs import alternate, ddp_pair, paired_overhead, paired_overhead_ci
from tests.multiproc import RankContext, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (input width, hidden widths, output width, batch) of each model
MODELS: dict[str, tuple[int, tuple[int, ...], int, int]] = {
    "tiny": (64, (256,), 64, 64),
    "mid": (256, (2048, 2048), 256, 64),
    "large": (256, (3072, 3072), 256, 64),
}
REEXEC_ENV = "TORCHFT_PG_BENCH_UNDER_TORCHFT"  # set once re-executed under torchft's python


def _model(name: str) -> Any:
    import torch

    width_in, hidden, width_out, _ = MODELS[name]
    torch.manual_seed(0)
    layers: list[Any] = []
    for a, b in zip((width_in, *hidden), hidden, strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(hidden[-1], width_out))
    return torch.nn.Sequential(*layers)


def _rank(ctx: RankContext) -> dict[str, Any]:
    """Rotate rounds of plain DDP, Manager DDP (and torchft's); or profile the
    Manager's steps."""
    import torch

    lighthouse, torchft_lighthouse, pids, name, rounds, steps, profile = ctx.args
    width_in, _, width_out, batch = MODELS[name]
    x = torch.randn(batch, width_in, generator=torch.Generator().manual_seed(ctx.rank))
    y = torch.randn(batch, width_out, generator=torch.Generator().manual_seed(ctx.rank + 7))
    pair = ddp_pair(ctx, lighthouse, lambda: _model(name), x, y, torchft_lighthouse)
    out: dict[str, Any]
    if profile:
        ctx.barrier("profile")
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.enable()
        for _ in range(rounds * steps):
            pair.ft_step()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        out = {
            "manager": [(time.perf_counter() - start) / (rounds * steps)],
            "profile": text.getvalue(),
        }
    else:
        probe = (
            (lambda: {mode: process_cpu_s(pid) for mode, pid in pids.items()})
            if ctx.rank == 0
            else None
        )
        out = dict(alternate(ctx, pair, rounds, steps, probe))
    pair.close()
    return out


def _torchft_version() -> str:
    from importlib import metadata

    for dist in ("torchft-nightly", "torchft"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            pass
    return "?"


def _reexec_under(python: str) -> None:
    """Run this benchmark again under torchft's `python`, this checkout first on
    its path (torchft's processes then import both torchft and torchft_pg)."""
    # torchft's Rust side logs every quorum at INFO: muted unless RUST_LOG is set
    env = dict(os.environ, **{REEXEC_ENV: "1", "RUST_LOG": os.environ.get("RUST_LOG", "error")})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    os.execve(python, [python, os.path.abspath(__file__), *sys.argv[1:]], env)


def _serve_lighthouse(kind: str) -> None:
    """Child process: our lighthouse (``ours``) or torchft's (``torchft``) on loopback.
    Prints its address as one JSON line, serves until stdin closes, then prints the
    CPU seconds this process used (user + system) as a second JSON line."""
    if kind == "ours":
        from lighthouse import LighthouseServer

        lh: Any = LighthouseServer(
            bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000, http_bind=None
        )
        address = lh.address()
    else:
        from torchft.coordination import (  # type: ignore[import-not-found]
            LighthouseServer as TorchftLighthouse,
        )

        lh = TorchftLighthouse(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000)
        # its address() names the host, which need not resolve to loopback
        address = "http://127.0.0.1:" + lh.address().rstrip("/").rsplit(":", 1)[1]
    print(json.dumps({"address": address}), flush=True)
    cpu = time.process_time()
    sys.stdin.read()  # EOF: the parent is done
    print(json.dumps({"cpu_s": time.process_time() - cpu}), flush=True)
    lh.shutdown()


class _LighthouseProcess:
    """A lighthouse in a child process (see `_serve_lighthouse`), so its CPU is its own."""

    def __init__(self, kind: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve-lighthouse", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.kill()
            raise RuntimeError(f"the {kind} lighthouse did not start (exit {self._proc.wait()})")
        self.address: str = json.loads(line)["address"]
        self.pid = self._proc.pid

    def close(self) -> float:
        """Stop it; the CPU seconds it used while serving."""
        try:
            out, _ = self._proc.communicate(input="", timeout=30)
            return float(json.loads(out.splitlines()[-1])["cpu_s"])
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()


def _measure(
    name: str, rounds: int, steps: int, torchft: bool, profile: bool
) -> dict[str, Any] | None:
    """One model's rounds; prints its table and returns its JSON fields."""
    ours = _LighthouseProcess("ours")
    theirs = _LighthouseProcess("torchft") if torchft else None
    lighthouse_cpu_s: dict[str, float] = {}
    try:
        per_rank = run_ranks(
            _rank,
            2,
            ours.address,
            theirs.address if theirs is not None else None,
            {"manager": ours.pid, **({"torchft": theirs.pid} if theirs is not None else {})},
            name,
            rounds,
            steps,
            profile,
            timeout=900,
        )
    finally:
        lighthouse_cpu_s["manager"] = ours.close()
        if theirs is not None:
            lighthouse_cpu_s["torchft"] = theirs.close()
    if profile:
        print(f"[{name}] Manager step {per_rank[0]['manager'][0] * 1e3:.2f} ms (under cProfile)")
        print(per_rank[0]["profile"])
        return None
    med = statistics.median
    r0 = per_rank[0]
    width_in, hidden, width_out, batch = MODELS[name]
    shape = "-".join(str(w) for w in (width_in, *hidden, width_out))
    print(
        f"[{name}] per-step time, 2 processes, MLP {shape}, batch {batch} "
        f"({rounds} rotating rounds x {steps} steps, median; leases on)"
    )
    fields: dict[str, Any] = {"model": name}
    plain_ms = med(v for r in per_rank for v in r["plain"]) * 1e3
    print(
        f"  plain torch DDP (Gloo)    {plain_ms:8.2f} ms   CPU {med(r0['plain_cpu']) * 1e3:7.2f} ms"
    )
    fields["plain_ms"] = plain_ms
    for mode, label in (
        ("manager", "torchft_pg Manager + DDP"),
        ("torchft", "torchft Manager + DDP"),
    ):
        if mode not in r0:
            continue
        ms = med(v for r in per_rank for v in r[mode]) * 1e3
        wall = paired_overhead(per_rank, mode, "plain")
        wall_lo, wall_hi = paired_overhead_ci(per_rank, mode, "plain")
        cpu = paired_overhead(per_rank, f"{mode}_cpu", "plain_cpu")
        delta = med(m - p for r in per_rank for m, p in zip(r[mode], r["plain"], strict=True))
        print(
            f"  {label:<25} {ms:8.2f} ms   CPU {med(r0[f'{mode}_cpu']) * 1e3:7.2f} ms"
            f"   overhead wall {wall * 100:+.1f}% ({delta * 1e3:+.2f} ms; 95% CI "
            f"{wall_lo * 100:+.1f} to {wall_hi * 100:+.1f}%), CPU {cpu * 100:+.1f}%"
        )
        key = "manager" if mode == "manager" else "torchft"
        # the variant's lighthouse while its rounds ran (its idle ticks included)
        probed = r0[f"{mode}_probe"]
        lh_ms = sum(probed) * 1e3 / (len(probed) * steps)
        run_ms = lighthouse_cpu_s[mode] * 1e3 / (rounds * steps)
        print(
            f"  {'':<25} its lighthouse's CPU per step {lh_ms:.3f} ms while its rounds ran "
            f"({run_ms:.3f} ms over the whole run)"
        )
        fields[f"{key}_lighthouse_cpu_ms_per_step"] = lh_ms
        fields[f"{key}_ms"] = ms
        fields[f"{key}_wall_overhead_paired"] = wall
        fields[f"{key}_wall_overhead_ci95"] = [wall_lo, wall_hi]
        fields[f"{key}_wall_delta_ms_paired"] = delta * 1e3
        fields[f"{key}_cpu_overhead_paired"] = cpu
    if "torchft" in r0:
        vs_wall = paired_overhead(per_rank, "manager", "torchft") + 1
        vs_lo, vs_hi = paired_overhead_ci(per_rank, "manager", "torchft")
        vs_cpu = paired_overhead(per_rank, "manager_cpu", "torchft_cpu") + 1
        print(
            f"  ours / torchft, paired rounds: wall {vs_wall:.3f}x "
            f"(95% CI {vs_lo + 1:.3f} to {vs_hi + 1:.3f}), CPU {vs_cpu:.3f}x"
        )
        fields["manager_vs_torchft_wall"] = vs_wall
        fields["manager_vs_torchft_wall_ci95"] = [vs_lo + 1, vs_hi + 1]
        fields["manager_vs_torchft_cpu"] = vs_cpu
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", nargs="+", choices=sorted(MODELS), default=["mid"], help="models to run"
    )
    parser.add_argument("--rounds", type=int, default=24, help="rotating rounds")
    parser.add_argument("--steps", type=int, default=4, help="steps per round")
    parser.add_argument("--profile", action="store_true", help="cProfile rank 0's Manager steps")
    parser.add_argument(
        "--torchft-python",
        default=os.environ.get("TORCHFT_PYTHON"),
        help="a python with torchft installed: also run torchft in this run (env TORCHFT_PYTHON)",
    )
    args = parser.parse_args()
    tft: str | None = args.torchft_python or None
    if tft is not None and not os.environ.get(REEXEC_ENV):
        if not (os.path.isfile(tft) and os.access(tft, os.X_OK)):
            parser.error(f"--torchft-python {tft}: not an executable file")
        _reexec_under(tft)
    report: dict[str, Any] = {"bench": "step_overhead", "models": []}
    if tft is None:
        print(
            "torchft not measured in this run: pass --torchft-python PATH or set "
            "TORCHFT_PYTHON to a python with torchft installed"
        )
    else:
        report["torchft"] = {"python": tft, "version": _torchft_version()}
    for name in args.model:
        fields = _measure(name, args.rounds, args.steps, tft is not None, args.profile)
        if fields is not None:
            report["models"].append(fields)
    if not args.profile:
        print(json.dumps(report))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-lighthouse":
        _serve_lighthouse(sys.argv[2])
    else:
        main()
