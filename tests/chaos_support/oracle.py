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

A replica whose state a CORRUPT_STATE fault changed (one flipped bit, see
`torchft_pg.chaos.corruption`) sends gradients taken at its own, corrupt
state until the integrity check votes it out and it heals. The replay keeps
a copy of the state with the same bit flipped from the corruption's step on,
steps it with every committed update, and takes that replica's gradient on
it: each contribution names the digest of the state it was taken at, which
must be the committed state's or the corrupt copy's (anything else fails),
and each commit the corrupt replica made must be the copy's state.

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

import copy
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
    state_tensors,
)
from torchft_pg.chaos.corruption import BitFlip, apply_bit_flip

__all__ = ["Batch", "CommittedStep", "Corruption", "History", "Verdict", "check", "replay"]


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One participant's contribution: its batch of `data_step`, and, as it reported
    them, its loss on it and the norm of the gradient it sent."""

    replica: int
    data_step: int
    loss: float | None = None
    sent_norm: float | None = None
    state_digest: str | None = None  # of the state its gradient was taken at


@dataclass(frozen=True, kw_only=True)
class Corruption:
    """`replica`'s state got bit `bit` of element `index` of `tensor` flipped at its
    step `step` (after committing step - 1, before its forward of `step`)."""

    replica: int
    step: int
    tensor: str
    index: int
    bit: int


@dataclass(frozen=True, kw_only=True)
class _Replayed:
    loss: float
    grad_norm: float


@dataclass(frozen=True, kw_only=True)
class _Applied:
    """What the replay applied at a step: the averaged gradient's norm, and the
    digest of the state after it (only where the step carries one to check);
    `problems`: contributions and corrupt commits the replay could not account for."""

    grad_norm: float
    digest: str | None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CommittedStep:
    """The update committed as step `step`: the sum of `batches`' gradients over `divisor`."""

    step: int
    divisor: int
    batches: tuple[Batch, ...]
    quorum: str = ""
    grad_norm: float | None = None  # as the replicas reported it: the norm of what they applied
    digest: str | None = None  # as the replicas reported it: of their state after the step
    # (replica, digest) of each commit by a replica whose state was corrupt
    corrupt_digests: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class History:
    """Every committed step of a job, from its initial state (`workload`)."""

    workload: Workload
    steps: tuple[CommittedStep, ...]
    corruptions: tuple[Corruption, ...] = ()


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
    # replica -> its corrupt copy of the state, from its corruption until it heals
    copies: dict[int, tuple[torch.nn.Module, torch.optim.Optimizer]] = {}
    digest_before = state_checksum(model.state_dict(), optim.state_dict())
    for cs in history.steps:
        problems: list[str] = []
        for c in history.corruptions:
            if c.step == cs.step:
                copies[c.replica] = _corrupt_copy(w, model, optim, c)
        total = [torch.zeros_like(p, dtype=REDUCE_DTYPE) for p in params]
        replayed = []
        for b in cs.batches:
            at = model
            if b.state_digest is not None and b.state_digest != digest_before:
                corrupt = copies.get(b.replica)
                if corrupt is not None and b.state_digest == _digest(corrupt):
                    at = corrupt[0]
                else:
                    problems.append(
                        f"step {cs.step} ({cs.quorum}): replica {b.replica} took its gradient at "
                        f"a state with digest {b.state_digest}, neither the committed state "
                        f"({digest_before}) nor a known corruption of it"
                    )
            elif b.replica in copies:
                del copies[b.replica]  # healed: it works on the committed state again
            loss, grads = _gradient(w, at, b)
            norm = float(torch.cat([g.reshape(-1) for g in grads]).norm().item())
            replayed.append(_Replayed(loss=loss, grad_norm=norm))
            for t, g in zip(total, grads, strict=True):
                t.add_(g)
        averaged = [
            t.div_(max(cs.divisor, 1)).to(p.dtype) for t, p in zip(total, params, strict=True)
        ]
        for p, g in zip(params, averaged, strict=True):
            p.grad = g.clone()
        grad_norm = float(torch.cat([g.reshape(-1) for g in averaged]).norm().item())
        optim.step()
        for copy_model, copy_optim in copies.values():
            for p, g in zip(copy_model.parameters(), averaged, strict=True):
                p.grad = g.clone()
            copy_optim.step()
        for replica, reported in cs.corrupt_digests:
            corrupt = copies.get(replica)
            if corrupt is None or _digest(corrupt) != reported:
                problems.append(
                    f"step {cs.step} ({cs.quorum}): replica {replica} committed a state with "
                    f"digest {reported} while corrupt, which the replay of its corruption "
                    f"does not give ({_digest(corrupt) if corrupt is not None else 'no copy'})"
                )
        digest_before = state_checksum(model.state_dict(), optim.state_dict())
        if on_step is not None:
            digest = digest_before if cs.digest is not None else None
            on_step(
                cs,
                replayed,
                _Applied(grad_norm=grad_norm, digest=digest, problems=tuple(problems)),
            )
    return flat_state(model, optim)


def _digest(state: tuple[torch.nn.Module, torch.optim.Optimizer]) -> str:
    return state_checksum(state[0].state_dict(), state[1].state_dict())


def _corrupt_copy(
    w: Workload, model: torch.nn.Module, optim: torch.optim.Optimizer, c: Corruption
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of (model, optim) with `c`'s bit flipped."""
    copy_model, copy_optim = w.build()
    copy_model.load_state_dict(model.state_dict())
    # A deep copy: loading keeps the given step-count tensors, which the copy's
    # steps would then advance for the committed optimizer too.
    copy_optim.load_state_dict(copy.deepcopy(optim.state_dict()))
    flip = BitFlip(tensor=c.tensor, index=c.index, bit=c.bit)
    apply_bit_flip(flip, state_tensors(copy_model, copy_optim))
    return copy_model, copy_optim


def _gradient(w: Workload, model: torch.nn.Module, b: Batch) -> tuple[float, list[torch.Tensor]]:
    """`b`'s loss and gradient at `model`'s state."""
    model.zero_grad(set_to_none=True)
    x, y = w.batch(b.replica, b.data_step)
    loss = w.loss(model(x), y)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    return float(loss.item()), [g for g in grads if g is not None]


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

    unaccounted: list[str] = []

    def on_step(cs: CommittedStep, replayed: list[_Replayed], applied: _Applied) -> None:
        grad_norm = applied.grad_norm
        if applied.problems and not unaccounted:
            unaccounted.append(applied.problems[0])
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
    failures.extend(unaccounted)
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
