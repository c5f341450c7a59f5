"""Quantized allreduce payloads: bytes saved and error introduced, vs float32.

What `Manager.allreduce(should_quantize=True)` (and `DiLoCo(should_quantize=True)`)
trades, measured on the data it is meant for: pseudo-gradients of 3 replica
groups, 1 Mi values each, in two shapes:

* ``normal``: i.i.d. N(0, 1e-3), the bulk of a pseudo-gradient;
* ``outliers``: the same with every 97th value 50x larger, which widens the
  int8 chunks' scales (the hard case for per-chunk scaling).

Per encoding: bytes per value on the wire (each rank receives ``n - 1``
encoded contributions, against a float32 ring allreduce's ``2 (n - 1) / n * 4``
bytes, ratio in the same run), the relative L2 error of the average against
the exact float32 one, the worst error of one value in units of its chunk's
scale (int8; at most 0.5 by construction) and the time to encode 3
contributions and decode-and-sum them on this CPU, as a ratio to the plain
float32 sum's.

Prints a table and, last, one JSON line. Pure tensor work: seconds.
"""

from __future__ import annotations

import json
import time

import torch

from torchft_pg.quantization import CHUNK, Quantization, decode, encode, encoded_numel, sum_encoded

GROUPS = 3
NUMEL = 1 << 20
REPEAT = 5


def _contributions(shape: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(NUMEL, generator=gen) * 1e-3 for _ in range(GROUPS)]
    if shape == "outliers":
        for p in parts:
            p[::97] *= 50.0
    return parts


def _best_of(fn: object) -> float:
    assert callable(fn)
    best = float("inf")
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    torch.set_num_threads(1)
    ring_bytes = 2 * (GROUPS - 1) / GROUPS * 4
    rows = []
    for shape in ("normal", "outliers"):
        parts = _contributions(shape)
        exact = torch.stack(parts).sum(0) / GROUPS
        plain_s = _best_of(lambda parts=parts: torch.stack(parts).sum(0) / GROUPS)
        for scheme in Quantization:
            encoded = [encode(p, scheme) for p in parts]
            got = sum_encoded(encoded, NUMEL, scheme) / GROUPS
            rel = float((got - exact).norm() / exact.norm())
            worst_in_scales = None
            if scheme is Quantization.INT8:
                chunks = NUMEL // CHUNK
                scales = parts[0].view(chunks, CHUNK).abs().amax(1) / 127
                one = decode(encoded[0], NUMEL, scheme)
                worst_in_scales = float(
                    ((one - parts[0]).view(chunks, CHUNK).abs() / scales.unsqueeze(1)).max()
                )

            def roundtrip(parts: list[torch.Tensor] = parts, scheme: Quantization = scheme) -> None:
                sum_encoded([encode(p, scheme) for p in parts], NUMEL, scheme)

            received = (GROUPS - 1) * encoded_numel(NUMEL, scheme) / NUMEL
            rows.append(
                {
                    "shape": shape,
                    "encoding": scheme.value,
                    "bytes_per_value_received": round(received, 3),
                    "ratio_to_fp32_ring": round(received / ring_bytes, 3),
                    "relative_l2_error": rel,
                    "worst_error_in_chunk_scales": worst_in_scales,
                    "codec_time_ratio_to_fp32_sum": round(_best_of(roundtrip) / plain_s, 2),
                }
            )
    print(
        f"quantized allreduce payloads, {GROUPS} groups x {NUMEL} values "
        f"(float32 ring: {ring_bytes:.2f} bytes/value received)"
    )
    print(
        f"{'shape':9} {'encoding':8} {'bytes/value':>11} {'vs fp32':>8} "
        f"{'rel L2 err':>11} {'worst/scale':>11} {'codec time':>10}"
    )
    for r in rows:
        worst = r["worst_error_in_chunk_scales"]
        print(
            f"{r['shape']:9} {r['encoding']:8} {r['bytes_per_value_received']:11.3f} "
            f"{r['ratio_to_fp32_ring']:7.2f}x {r['relative_l2_error']:11.2e} "
            f"{'-' if worst is None else f'{worst:.3f}':>11} "
            f"{r['codec_time_ratio_to_fp32_sum']:9.1f}x"
        )
    print(json.dumps({"bench": "quantize", "groups": GROUPS, "numel": NUMEL, "rows": rows}))


if __name__ == "__main__":
    main()
