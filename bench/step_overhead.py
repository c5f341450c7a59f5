"""Per-step cost of fault-tolerant DDP over plain torch DDP, on a mid-size MLP.

Two processes train the same ~5.3 M-parameter MLP (256 -> 2048 -> 2048 -> 256,
batch 64, Adam) with plain torch DDP over Gloo and with `torchft_pg`'s Manager +
DDP (quorum leases on, the default), in short alternating rounds on the same
processes: adjacent rounds share the machine's load, so the median of each
round's ratio to its neighbour is the overhead (wall, and CPU of all of a
rank's threads). `--profile` instead runs cProfile over the Manager's steps on
rank 0 and prints where their time went.

    PYTHONPATH=. .venv/bin/python bench/step_overhead.py [--rounds 24] [--steps 4] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ddp_pairs import alternate, ddp_pair, paired_overhead
from tests.multiproc import RankContext, run_ranks

WIDTH_IN, HIDDEN, WIDTH_OUT = 256, 2048, 256


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH_IN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, WIDTH_OUT),
    )


def _rank(ctx: RankContext) -> dict[str, Any]:
    """Alternate rounds of plain DDP and Manager DDP; or profile the Manager's steps."""
    import torch

    lighthouse, rounds, steps, profile = ctx.args
    x = torch.randn(64, WIDTH_IN, generator=torch.Generator().manual_seed(ctx.rank))
    y = torch.randn(64, WIDTH_OUT, generator=torch.Generator().manual_seed(ctx.rank + 7))
    pair = ddp_pair(ctx, lighthouse, _model, x, y)
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
        out = dict(alternate(ctx, pair, rounds, steps))
    pair.close()
    return out


def main() -> None:
    from lighthouse import LighthouseServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=24, help="alternating rounds")
    parser.add_argument("--steps", type=int, default=4, help="steps per round")
    parser.add_argument("--profile", action="store_true", help="cProfile rank 0's Manager steps")
    args = parser.parse_args()
    lh = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000)
    try:
        per_rank = run_ranks(
            _rank, 2, lh.address(), args.rounds, args.steps, args.profile, timeout=900
        )
    finally:
        lh.shutdown()
    if args.profile:
        print(f"Manager step {per_rank[0]['manager'][0] * 1e3:.2f} ms (under cProfile)")
        print(per_rank[0]["profile"])
        return
    med = statistics.median
    r0 = per_rank[0]
    wall, cpu = (
        paired_overhead(per_rank, "manager", "plain"),
        paired_overhead(per_rank, "manager_cpu", "plain_cpu"),
    )
    plain_ms = med(v for r in per_rank for v in r["plain"]) * 1e3
    ours_ms = med(v for r in per_rank for v in r["manager"]) * 1e3
    delta_ms = med(m - p for r in per_rank for m, p in zip(r["manager"], r["plain"], strict=True))
    print(
        f"per-step time, 2 processes, MLP {WIDTH_IN}-{HIDDEN}-{HIDDEN}-{WIDTH_OUT} "
        f"({args.rounds} alternating rounds x {args.steps} steps, median; leases on)"
    )
    print(
        f"  plain torch DDP (Gloo)    {plain_ms:8.2f} ms   CPU {med(r0['plain_cpu']) * 1e3:6.2f} ms"
    )
    print(
        f"  torchft_pg Manager + DDP  {ours_ms:8.2f} ms   CPU {med(r0['manager_cpu']) * 1e3:6.2f} ms"
        f"   overhead {wall * 100:+.1f}% ({delta_ms * 1e3:+.2f} ms, paired rounds, both ranks)"
    )
    print(f"  CPU per step, paired the same way                   overhead {cpu * 100:+.1f}%")
    print(
        json.dumps(
            {
                "bench": "step_overhead",
                "plain_ms": plain_ms,
                "manager_ms": ours_ms,
                "wall_overhead_paired": wall,
                "wall_delta_ms_paired": delta_ms * 1e3,
                "cpu_overhead_paired": cpu,
            }
        )
    )


if __name__ == "__main__":
    main()
