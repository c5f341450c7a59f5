"""PGTransport between 2 real processes over a raw torch Gloo process group."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tests.multiproc import RankContext, run_ranks

T = timedelta(seconds=20)


def _state_dict(seed: int, zeros: bool = False) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(256, 128, generator=g)
    sd: dict[str, Any] = {
        "model": {
            "w": w,
            "w_t": w.t(),
            "big": torch.randn(1 << 20, generator=g),
            "bf": torch.randn(9, generator=g).bfloat16(),
            "ints": torch.arange(7, dtype=torch.int32),
            "empty": torch.empty(0, 4),
        },
        "optim": {
            "state": {0: {"step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}],
        },
        "flags": torch.tensor([True, False]),
        "name": "run-1",
    }
    if zeros:
        for k, v in sd["model"].items():
            if k != "w_t":
                v.zero_()
    return sd


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    tensors_ok = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    return (
        tensors_ok
        and a["optim"]["param_groups"] == b["optim"]["param_groups"]
        and torch.equal(a["flags"], b["flags"])
        and a["name"] == b["name"]
    )


def _pg(ctx: RankContext, name: str) -> Any:
    return dist.ProcessGroupGloo(dist.PrefixStore(name, ctx.store), ctx.rank, 2, T)


def _scenarios(ctx: RankContext) -> dict[str, Any]:
    from torchft_pg.checkpointing import PGTransport, pg_transport
    from torchft_pg.errors import RecoveryError

    out: dict[str, Any] = {}
    pg = _pg(ctx, "main")
    cpu = torch.device("cpu")
    plain = PGTransport[dict[str, Any]](pg, T, cpu)

    # 1. rank 0 → rank 1 into fresh memory
    if ctx.rank == 0:
        plain.send_checkpoint([1], 5, _state_dict(5), T)
    else:
        got = plain.recv_checkpoint(0, plain.metadata(), 5, T)
        out["fresh_ok"] = _same(got, _state_dict(5))
        out["view_kept"] = got["model"]["w_t"].data_ptr() == got["model"]["w"].data_ptr()

    # 2. rank 1 → rank 0 in place into rank 0's existing tensors
    if ctx.rank == 1:
        plain.send_checkpoint([0], 6, _state_dict(6), T)
    else:
        mine = _state_dict(0, zeros=True)
        ptrs = {k: v.data_ptr() for k, v in mine["model"].items()}
        in_place = PGTransport[dict[str, Any]](pg, T, cpu, state_dict=lambda: mine)
        got = in_place.recv_checkpoint(1, "<n/a>", 6, T)
        out["in_place_ok"] = _same(got, _state_dict(6))
        out["same_memory"] = all(
            got["model"][k] is mine["model"][k] and mine["model"][k].data_ptr() == ptrs[k]
            for k in ("w", "big", "bf", "ints")
        )

    # 3. checksum mismatch detected by the receiver
    if ctx.rank == 0:
        plain.send_checkpoint([1], 7, _state_dict(7), T)
    else:
        real = pg_transport.blob_digest
        pg_transport.blob_digest = lambda b: real(b) ^ 1  # type: ignore[assignment]
        try:
            plain.recv_checkpoint(0, "<n/a>", 7, T)
            out["checksum_error"] = None
        except RecoveryError as exc:
            out["checksum_error"] = str(exc)
        finally:
            pg_transport.blob_digest = real
    ctx.barrier("after-checksum")

    # 4. wrong step (own PG: an aborted transfer leaves messages in flight)
    wrong = PGTransport[dict[str, Any]](_pg(ctx, "wrong"), T, cpu)
    if ctx.rank == 0:
        try:
            wrong.send_checkpoint([1], 8, _state_dict(8), timedelta(seconds=1))
        except RecoveryError as exc:
            out["sender_error"] = str(exc)
    else:
        try:
            wrong.recv_checkpoint(0, "<n/a>", 9, T)
            out["wrong_step_error"] = None
        except RecoveryError as exc:
            out["wrong_step_error"] = str(exc)
    ctx.barrier("after-wrong-step")

    # 5. nobody sends: the receiver gives up within its timeout
    if ctx.rank == 1:
        silent = PGTransport[dict[str, Any]](_pg(ctx, "silent"), T, cpu)
        start = time.monotonic()
        try:
            silent.recv_checkpoint(0, "<n/a>", 1, timedelta(seconds=0.5))
            out["timeout_error"] = None
        except RecoveryError as exc:
            out["timeout_error"] = str(exc)
        out["timeout_elapsed"] = time.monotonic() - start
        ctx.barrier("done")
    else:
        keep = _pg(ctx, "silent")  # alive but silent until rank 1 gave up
        ctx.barrier("done")
        del keep
    return out


def test_pg_transport_between_two_gloo_processes() -> None:
    r0, r1 = run_ranks(_scenarios, 2, timeout=90)
    assert r1["fresh_ok"] is True and r1["view_kept"] is True
    assert r0["in_place_ok"] is True
    assert r0["same_memory"] is True, "matching tensors must be received into the existing memory"
    assert r1["checksum_error"] and "checksum mismatch" in r1["checksum_error"]
    assert r1["wrong_step_error"] and "sent step 8, expected step 9" in r1["wrong_step_error"]
    assert r1["timeout_error"] and "step 1 from rank 0" in r1["timeout_error"]
    assert 0.4 < r1["timeout_elapsed"] < 0.5 + 1.5  # slack for a loaded CI box
    assert "sending step 8 to rank 1" in r0["sender_error"], (
        "the sender gives up within its timeout"
    )
