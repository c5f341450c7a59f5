"""The oracle: replay a job's committed history in one process and compare with the replicas.

Per-step digests show that replicas agree with each other; they cannot show
that all of them are right: an update lost, or applied twice, on every
replica alike leaves them equal. The oracle rebuilds the initial model and
optimizer (`Workload.build`, seeded) and, for every committed step in order,
applies the update that step's participants produce, exactly as DDP and the
Manager compute it:

* each participant's gradient is the gradient of its loss on its own batch
  (`Workload.batch(replica, data_step)`), taken at the committed state;
* the allreduce sums every member's bucket, where a healing or spare member
  contributes zeros, and divides by the Manager's number of participants
  (`divisor`; e.g. on a fresh job with `init_sync` every replica counts but
  only the primary contributes). The replicas reduce in `REDUCE_DTYPE`
  (float64), where the sum of float32 gradients is exact in any order, so the
  replay computes the bit-identical average;
* the optimizer then steps once.

So the replay follows the replicas bit for bit: after every committed step its
state digest must equal the one the committers reported, which names the
first step whose committed state is not the committed history's. The final
state must match each replica's (within float tolerance, a second opinion
that also names the worst value), and the optimizer's step count exactly.
Each participant's reported loss and gradient norm, and the applied
gradient's norm, are checked against the replay's at the same step. Pure: a
function of the recorded history.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from tests.chaos_support.workload import (
    REDUCE_DTYPE,
    FlatState,
    Workload,
    flat_state,
    state_checksum,
)

__all__ = ["Batch", "CommittedStep", "History", "Verdict", "check", "replay"]


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One participant's contribution: its batch of `data_step`, and, as it reported
    them, its loss on it and the norm of the gradient it sent."""

    replica: int
    data_step: int
    loss: float | None = None
    sent_norm: float | None = None


@dataclass(frozen=True, kw_only=True)
class _Replayed:
    loss: float
    grad_norm: float


@dataclass(frozen=True, kw_only=True)
class _Applied:
    """What the replay applied at a step: the averaged gradient's norm, and the
    digest of the state after it (only where the step carries one to check)."""

    grad_norm: float
    digest: str | None


@dataclass(frozen=True, kw_only=True)
class CommittedStep:
    """The update committed as step `step`: the sum of `batches`' gradients over `divisor`."""

    step: int
    divisor: int
    batches: tuple[Batch, ...]
    quorum: str = ""
    grad_norm: float | None = None  # as the replicas reported it: the norm of what they applied
    digest: str | None = None  # as the replicas reported it: of their state after the step


@dataclass(frozen=True, kw_only=True)
class History:
    """Every committed step of a job, from its initial state (`workload`)."""

    workload: Workload
    steps: tuple[CommittedStep, ...]


@dataclass(frozen=True, kw_only=True)
class Verdict:
    failures: tuple[str, ...]
    steps_replayed: int
    max_error: float  # largest |replica - replay| over every final float value
    # largest relative |reported - replayed| of a loss, or of a sent or applied gradient's norm
    max_loss_error: float

    @property
    def ok(self) -> bool:
        return not self.failures


def _validate(history: History) -> list[str]:
    failures = []
    for i, cs in enumerate(history.steps):
        if cs.step != i:
            failures.append(
                f"the committed history is not contiguous: entry {i} is step {cs.step} "
                f"(steps {[c.step for c in history.steps]})"
            )
            break
        if not cs.batches:
            failures.append(f"step {cs.step} ({cs.quorum}) was committed with no participant")
        if cs.divisor < max(1, len(cs.batches)):
            failures.append(
                f"step {cs.step} ({cs.quorum}) divides by {cs.divisor} but "
                f"{len(cs.batches)} replicas contributed"
            )
    return failures


def replay(
    history: History,
    on_step: Callable[[CommittedStep, list[_Replayed], _Applied], None] | None = None,
) -> FlatState:
    """The state after applying every committed step to the initial state.

    `on_step(step, replayed, applied)` sees each step's participants' losses
    and gradient norms, in `batches` order, taken before its update, and what
    the update applied (with the state's digest after it where `step.digest`
    is set).
    """
    w = history.workload
    model, optim = w.build()
    params = list(model.parameters())
    for cs in history.steps:
        total = [torch.zeros_like(p, dtype=REDUCE_DTYPE) for p in params]
        replayed = []
        for b in cs.batches:
            model.zero_grad(set_to_none=True)
            x, y = w.batch(b.replica, b.data_step)
            loss = w.loss(model(x), y)
            loss.backward()
            grads = [p.grad for p in params]
            assert all(g is not None for g in grads)
            norm = float(torch.cat([g.reshape(-1) for g in grads if g is not None]).norm().item())
            replayed.append(_Replayed(loss=float(loss.item()), grad_norm=norm))
            for t, g in zip(total, grads, strict=True):
                assert g is not None
                t.add_(g)
        for t, p in zip(total, params, strict=True):
            p.grad = t.div_(max(cs.divisor, 1)).to(p.dtype)
        grad_norm = float(
            torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]).norm().item()
        )
        optim.step()
        if on_step is not None:
            digest = (
                state_checksum(model.state_dict(), optim.state_dict())
                if cs.digest is not None
                else None
            )
            on_step(cs, replayed, _Applied(grad_norm=grad_norm, digest=digest))
    return flat_state(model, optim)


def check(
    history: History,
    finals: Mapping[str, FlatState],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    loss_rtol: float = 1e-4,
) -> Verdict:
    """Replay `history`; compare the replay with each final state in `finals` (label -> state).

    Float values must agree within `atol + rtol * |replay|`; the optimizer's
    step counts (keys ending in ``.step``) exactly; each reported loss, and each
    sent and applied gradient's norm, within `loss_rtol` (relative) of the replay's:
    the replay is bit-exact,
    so these tolerances only absorb the norms being taken in another dtype.
    """
    failures = _validate(history)
    if failures:
        return Verdict(
            failures=tuple(failures), steps_replayed=0, max_error=0.0, max_loss_error=0.0
        )
    loss_errors: list[float] = []
    first_divergence: list[str] = []
    first_update: list[str] = []
    first_sent: list[str] = []
    first_state: list[str] = []

    def on_step(cs: CommittedStep, replayed: list[_Replayed], applied: _Applied) -> None:
        grad_norm = applied.grad_norm
        if cs.digest is not None and applied.digest != cs.digest and not first_state:
            first_state.append(
                f"step {cs.step} ({cs.quorum}): the replicas committed a state with digest "
                f"{cs.digest}, the committed history gives {applied.digest}: the first step "
                "whose committed state is not the replay's"
            )
        if cs.grad_norm is not None:
            err = abs(cs.grad_norm - grad_norm) / max(grad_norm, 1e-6)
            loss_errors.append(err)
            if err > loss_rtol and not first_update:
                first_update.append(
                    f"step {cs.step} ({cs.quorum}): the replicas applied a gradient of norm "
                    f"{cs.grad_norm:.6g}, the participants' batches average to one of norm "
                    f"{grad_norm:.6g}: the update of step {cs.step} was not the committed one"
                )
        for b, r in zip(cs.batches, replayed, strict=True):
            if b.loss is not None:
                err = abs(b.loss - r.loss) / max(abs(r.loss), 1e-6)
                loss_errors.append(err)
                if err > loss_rtol and not first_divergence:
                    first_divergence.append(
                        f"step {cs.step} ({cs.quorum}): replica {b.replica} reported loss "
                        f"{b.loss:.6g} on its batch of step {b.data_step}, the replay gives "
                        f"{r.loss:.6g}: its state before step {cs.step} was not the committed one"
                    )
            if b.sent_norm is not None and b.loss is not None:
                err = abs(b.sent_norm - r.grad_norm) / max(r.grad_norm, 1e-6)
                loss_errors.append(err)
                if err > loss_rtol and not first_sent:
                    first_sent.append(
                        f"step {cs.step} ({cs.quorum}): replica {b.replica} sent a gradient of "
                        f"norm {b.sent_norm:.6g}, its batch of step {b.data_step} gives "
                        f"{r.grad_norm:.6g} at the committed state: what it sent was not its "
                        "gradient"
                    )

    expected = replay(history, on_step)
    failures.extend(first_state)
    failures.extend(first_divergence)
    failures.extend(first_sent)
    failures.extend(first_update)
    max_error = 0.0
    for label, state in sorted(finals.items()):
        if sorted(state) != sorted(expected):
            failures.append(
                f"{label}: state keys {sorted(state)} differ from the replay's {sorted(expected)}"
            )
            continue
        worst: tuple[float, str] | None = None
        for key, want in expected.items():
            got = state[key]
            if len(got) != len(want):
                failures.append(f"{label}: {key} has {len(got)} values, the replay {len(want)}")
                continue
            if key.endswith(".step"):
                if got != want:
                    failures.append(
                        f"{label}: the optimizer took {got[0]:g} steps, the committed history "
                        f"{want[0]:g} (an update lost or applied twice)"
                    )
                continue
            for g, e in zip(got, want, strict=True):
                err = abs(g - e) if math.isfinite(g) else math.inf
                bad = err > atol + rtol * abs(e)
                if bad and (worst is None or err > worst[0]):
                    worst = (err, f"{key}: {g!r} vs {e!r}")
                max_error = max(max_error, err)
        if worst is not None:
            failures.append(
                f"{label}: final state differs from the replay of {len(history.steps)} committed "
                f"steps (worst {worst[1]}, |diff| {worst[0]:.3g})"
            )
    return Verdict(
        failures=tuple(failures),
        steps_replayed=len(history.steps),
        max_error=max_error,
        max_loss_error=max(loss_errors, default=0.0),
    )
