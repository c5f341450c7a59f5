"""What the integrity check (silent data corruption) costs per step.

Every `integrity_check_every` committed steps (default 100) each rank digests
its registered state (`torchft_pg.manager.fingerprint.fingerprint_state`:
parameters and optimizer state) and allgathers a 4 KiB vector with its peers.
This measures the digest of a ~5 M-parameter MLP's state (model + Adam, ~60 MB)
against a training step of the same model (forward, backward, Adam), in
alternating rounds so load cancels, and prints the cost per step at the
default interval: the digest's time over 100 steps, as a fraction of one step.
The allgather of 4 KiB (well under a millisecond here, see
`bench/collectives.py`) is left out.

With `integrity_check_gradients=True` a checked step also digests every
averaged gradient its allreduces produced (`gradient_digests`, the same
digest): timed here as the model's gradients (model-sized, ~21 MB) recorded
and taken as the results of one step's allreduces, and printed per step at
the default interval like the state's.

    python bench/integrity.py [--rounds 7]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.distributed import ReduceOp

from torchft_pg.manager.fingerprint import fingerprint_state
from torchft_pg.manager.gradient_digests import GradientDigests
from torchft_pg.manager.integrity_check import DEFAULT_CHECK_EVERY

BUDGET = 0.01  # the bound: at most 1% of a step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 256),
    )
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())
    x, y = torch.randn(args.batch, 256), torch.randn(args.batch, 256)

    def step() -> None:
        optim.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optim.step()

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    gradients = GradientDigests(due=lambda: True, enabled=True)

    def digest_gradients() -> None:
        """What a checked step adds with the option on: each allreduce result
        (here each gradient) digested as it completes, then taken at the vote."""
        gradients.begin_step()
        for p in model.parameters():
            slot = gradients.slot()
            assert slot is not None and p.grad is not None
            gradients.record(slot, p.grad, ReduceOp.AVG)
        gradients.take()

    step()  # Adam's state exists from here on
    fingerprint_state(state())  # warm: the weights' tensor is built once
    digest_gradients()
    step_s: list[float] = []
    digest_s: list[float] = []
    gradient_s: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        fingerprint_state(state())
        t2 = time.perf_counter()
        digest_gradients()
        t3 = time.perf_counter()
        step_s.append(t1 - t0)
        digest_s.append(t2 - t1)
        gradient_s.append(t3 - t2)
    state_mb = (
        sum(
            t.numel() * t.element_size()
            for t in [*model.state_dict().values()]
            + [v for s in optim.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        )
        / 1e6
    )
    gradient_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    step_ms = statistics.median(step_s) * 1000
    digest_ms = statistics.median(digest_s) * 1000
    gradient_ms = statistics.median(gradient_s) * 1000
    per_step = digest_ms / DEFAULT_CHECK_EVERY / step_ms
    gradient_per_step = gradient_ms / DEFAULT_CHECK_EVERY / step_ms
    print(
        f"integrity check: {params / 1e6:.1f} M parameters, {state_mb:.0f} MB of state "
        f"(model + Adam), median of {args.rounds} alternating rounds"
    )
    print(f"{'training step':<32} {step_ms:9.2f} ms")
    print(f"{'digest of the state':<32} {digest_ms:9.2f} ms  ({digest_ms / step_ms:.1%} of a step)")
    print(
        f"{'per step, every ' + str(DEFAULT_CHECK_EVERY) + ' steps':<32} "
        f"{digest_ms / DEFAULT_CHECK_EVERY:9.3f} ms  ({per_step:.3%} of a step; target <= {BUDGET:.0%})"
    )
    print(
        f"{f'digest of the gradients ({gradient_mb:.0f} MB)':<32} {gradient_ms:9.2f} ms  "
        f"({gradient_ms / step_ms:.1%} of a step; integrity_check_gradients=True only)"
    )
    print(
        f"{'  per step, every ' + str(DEFAULT_CHECK_EVERY) + ' steps':<32} "
        f"{gradient_ms / DEFAULT_CHECK_EVERY:9.3f} ms  ({gradient_per_step:.3%} of a step)"
    )
    print(
        json.dumps(
            {
                "bench": "integrity",
                "params": params,
                "state_mb": round(state_mb, 1),
                "step_ms": round(step_ms, 3),
                "digest_ms": round(digest_ms, 3),
                "check_every": DEFAULT_CHECK_EVERY,
                "cost_per_step_fraction": per_step,
                "within_budget": per_step <= BUDGET,
                "gradient_mb": round(gradient_mb, 1),
                "gradient_digest_ms": round(gradient_ms, 3),
                "gradient_cost_per_step_fraction": gradient_per_step,
            }
        )
    )


if __name__ == "__main__":
    main()
