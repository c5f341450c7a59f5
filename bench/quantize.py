"""Quantized allreduce: bytes per rank, error and time of both exchanges, vs float32.

What `Manager.allreduce(should_quantize=True)` (and `DiLoCo(should_quantize=True)`)
trades, in two parts:

1. Pure tensor work, on the data it is meant for: pseudo-gradients of N = 2,
   4 and 8 replica groups, 1 Mi values each, in two shapes:

   * ``normal``: i.i.d. N(0, 1e-3), the bulk of a pseudo-gradient;
   * ``outliers``: the same with every 97th value 50x larger, which widens the
     int8 chunks' scales (the hard case for per-chunk scaling);
   * ``correlated``: a part shared by every group plus 0.3x as much of each
     group's own (groups training one model mostly agree). The allgather's
     roundings, independent from group to group, then shrink relative to the
     sum as N grows; the reduce-scatter's second rounding does not.

   Per encoding and exchange (``allgather``: every member's whole encoding to
   every member, the scheme before the reduce-scatter; ``reduce_scatter``:
   encoded shards in one alltoall, each member's shard summed and re-encoded,
   the sums allgathered; `torchft_pg.quantization`): the bytes per value one
   rank sends and receives, as a ratio to a float32 ring allreduce's
   ``2 (N - 1) / N * 4`` (the same at every N for the reduce-scatter; growing
   with N for the allgather), the relative L2 error of the average against
   the exact float32 one (the reduce-scatter's re-encoding of the summed
   shards is a second rounding), and one member's encode/decode/sum time.

2. Real collectives: 2 and 4 processes on 127.0.0.1, each a `ProcessGroupGloo`
   member, time one allreduce of 2 Mi values (8 MiB in float32) as a float32
   allreduce and as each quantized exchange (`QuantizedSum`, the Manager's
   path), the variants alternating op by op so machine noise hits them alike;
   the median over the iterations, and its ratio to the float32 allreduce of
   the same run. On one machine the bytes cross no network: this measures
   the codec's CPU cost and the collectives' latency, not a wire's bandwidth.

Prints two tables and, last, one JSON line. About a minute on 2 cores.

    .venv/bin/python bench/quantize.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.multiproc import RankContext, run_ranks
from torchft_pg.quantization import (
    Exchange,
    Quantization,
    ShardLayout,
    decode_shards,
    encode,
    encode_shards,
    reduce_shards,
    ring_traffic,
    shard_layout,
    simulated_sum,
    sum_encoded,
    traffic,
)

GROUPS = (2, 4, 8)
NUMEL = 1 << 20
REPEAT = 3
TIMED_RANKS = (2, 4)
TIMED_NUMEL = 1 << 21
TIMED_ITERS = 20


SHAPES = ("normal", "outliers", "correlated")


def _contributions(shape: str, groups: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(NUMEL, generator=gen) * 1e-3 for _ in range(groups)]
    if shape == "outliers":
        for p in parts:
            p[::97] *= 50.0
    elif shape == "correlated":  # the groups mostly agree: a shared part, 0.3x of their own
        shared = torch.randn(NUMEL, generator=gen) * 1e-3
        parts = [shared + 0.3 * p for p in parts]
    return parts


def _best_of(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _one_member(
    parts: list[torch.Tensor], scheme: Quantization, exchange: Exchange
) -> Callable[[], object]:
    """Member 0's own codec work in one sum (what it encodes, decodes and adds)."""
    if exchange is Exchange.ALLGATHER:
        others = [encode(p, scheme) for p in parts]

        def whole() -> object:
            encode(parts[0], scheme)
            return sum_encoded(others, NUMEL, scheme)

        return whole
    layout: ShardLayout = shard_layout(NUMEL, len(parts), scheme)
    size = layout.shard_bytes
    sent = [encode_shards(p, layout) for p in parts]
    received = torch.cat([s[:size] for s in sent])
    gathered = torch.cat([s[:size] for s in sent])  # stands in for the summed shards

    def shards() -> object:
        encode_shards(parts[0], layout)
        reduce_shards(received, layout)
        return decode_shards(gathered, layout)

    return shards


def _pure_rows() -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    rows = []
    for groups in GROUPS:
        ring = ring_traffic(NUMEL, groups)
        for shape in SHAPES:
            parts = _contributions(shape, groups)
            exact = torch.stack(parts).sum(0) / groups
            for scheme in Quantization:
                for exchange in Exchange:
                    got = simulated_sum(parts, scheme, exchange) / groups
                    moved = traffic(NUMEL, groups, scheme, exchange)
                    rows.append(
                        {
                            "groups": groups,
                            "shape": shape,
                            "encoding": scheme.value,
                            "exchange": exchange.value,
                            "sent_bytes_per_value": round(moved.sent / NUMEL, 4),
                            "received_bytes_per_value": round(moved.received / NUMEL, 4),
                            "ratio_to_fp32_ring": round(moved.sent / ring.sent, 4),
                            "relative_l2_error": float((got - exact).norm() / exact.norm()),
                            "member_codec_ms": round(
                                _best_of(_one_member(parts, scheme, exchange)) * 1e3, 2
                            ),
                        }
                    )
    return rows


def _print_pure(rows: list[dict[str, Any]]) -> None:
    print(
        f"quantized allreduce, bytes per rank and error, {NUMEL} values per group "
        "(float32 ring: 2(N-1)/N * 4 bytes/value sent and received)"
    )
    print(
        f"{'N':>2} {'shape':10} {'enc':4} {'exchange':14} {'sent B/v':>8} {'recv B/v':>8} "
        f"{'vs fp32':>8} {'rel L2 err':>10} {'codec ms':>8}"
    )
    for r in rows:
        print(
            f"{r['groups']:>2} {r['shape']:10} {r['encoding']:4} {r['exchange']:14} "
            f"{r['sent_bytes_per_value']:8.3f} {r['received_bytes_per_value']:8.3f} "
            f"{r['ratio_to_fp32_ring']:7.3f}x {r['relative_l2_error']:10.2e} "
            f"{r['member_codec_ms']:8.2f}"
        )


# -- real collectives --------------------------------------------------------------------


def _timed(ctx: RankContext) -> dict[str, list[float]]:
    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager.quantized_sum import QuantizedSum

    iters, numel = ctx.args
    torch.set_num_threads(1)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=60))
    pg.configure(ctx.addr("quantize"), ctx.rank, ctx.world_size)
    gen = torch.Generator().manual_seed(ctx.rank)
    grad = torch.randn(numel, generator=gen) * 1e-3

    def fp32() -> None:
        pg.allreduce([grad.clone()]).wait()

    def quantized(scheme: Quantization, exchange: Exchange) -> Callable[[], None]:
        def run() -> None:
            summing = QuantizedSum(pg, grad, scheme, exchange=exchange)
            summing.future.wait()
            summing.total()

        return run

    variants: dict[str, Callable[[], None]] = {"fp32 allreduce": fp32}
    for scheme in Quantization:
        for exchange in Exchange:
            variants[f"{scheme.value} {exchange.value}"] = quantized(scheme, exchange)
    for fn in variants.values():  # warm-up: first use allocates, connects pairs
        fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(iters):
        ctx.barrier(f"iter/{i}")
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    pg.shutdown()
    return samples


def _timed_rows(iters: int) -> list[dict[str, Any]]:
    rows = []
    for world in TIMED_RANKS:
        per_rank = run_ranks(_timed, world, iters, TIMED_NUMEL, timeout=300)
        # an op's time is its slowest rank's: the median over iterations of that
        names = list(per_rank[0])
        worst = {n: [max(r[n][i] for r in per_rank) for i in range(iters)] for n in names}
        base = statistics.median(worst["fp32 allreduce"])
        for name in names:
            median = statistics.median(worst[name])
            row: dict[str, Any] = {
                "ranks": world,
                "variant": name,
                "median_ms": round(median * 1e3, 2),
                "ratio_to_fp32": round(median / base, 3),
            }
            if name != "fp32 allreduce":
                scheme, exchange = (s for s in name.split())
                moved = traffic(TIMED_NUMEL, world, Quantization(scheme), Exchange(exchange))
                row["sent_bytes_per_value"] = round(moved.sent / TIMED_NUMEL, 4)
            else:
                row["sent_bytes_per_value"] = round(
                    ring_traffic(TIMED_NUMEL, world).sent / TIMED_NUMEL, 4
                )
            rows.append(row)
    return rows


def _print_timed(rows: list[dict[str, Any]], iters: int) -> None:
    print(
        f"\none allreduce of {TIMED_NUMEL} values, ProcessGroupGloo on 127.0.0.1 "
        f"(median of {iters}, slowest rank each)"
    )
    print(f"{'ranks':>5} {'variant':24} {'sent B/v':>8} {'ms':>8} {'vs fp32':>8}")
    for r in rows:
        print(
            f"{r['ranks']:>5} {r['variant']:24} {r['sent_bytes_per_value']:8.3f} "
            f"{r['median_ms']:8.2f} {r['ratio_to_fp32']:7.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed iterations")
    args = parser.parse_args()
    iters = 3 if args.quick else TIMED_ITERS
    pure = _pure_rows()
    _print_pure(pure)
    timed = _timed_rows(iters)
    _print_timed(timed, iters)
    print(
        json.dumps(
            {
                "bench": "quantize",
                "numel": NUMEL,
                "rows": pure,
                "timed_numel": TIMED_NUMEL,
                "timed": timed,
            }
        )
    )


if __name__ == "__main__":
    main()
