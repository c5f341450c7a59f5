"""The chaos oracle: a replay of the committed history matches DDP's arithmetic and
catches an update lost, applied twice or averaged wrongly, even when every
replica agrees."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tests.chaos_support.oracle import Batch, CommittedStep, History, check, replay
from tests.chaos_support.workload import REDUCE_DTYPE, FlatState, Workload, flat_state

WORKLOAD = Workload(seed=3, hidden=8)


def _history() -> History:
    """3 replicas, 6 steps: step 0 with init_sync (only the primary contributes, all
    three count), step 3 with replica 2 healing (contributes zeros, not counted)."""
    steps = []
    batches: tuple[Batch, ...]
    for s in range(6):
        if s == 0:
            batches, divisor = (Batch(replica=0, data_step=0),), 3
        elif s == 3:
            batches, divisor = (Batch(replica=0, data_step=3), Batch(replica=1, data_step=3)), 2
        else:
            batches = tuple(Batch(replica=r, data_step=s) for r in range(3))
            divisor = 3
        steps.append(CommittedStep(step=s, divisor=divisor, batches=batches, quorum="e/1"))
    return History(workload=WORKLOAD, steps=tuple(steps))


def _with_losses(history: History) -> History:
    """The history with every participant's loss as the replay computes it."""
    losses: dict[int, list[float]] = {}
    replay(history, lambda cs, rs, _: losses.__setitem__(cs.step, [r.loss for r in rs]))
    return dataclasses.replace(
        history,
        steps=tuple(
            dataclasses.replace(
                cs,
                batches=tuple(
                    dataclasses.replace(b, loss=loss)
                    for b, loss in zip(cs.batches, losses[cs.step], strict=True)
                ),
            )
            for cs in history.steps
        ),
    )


def _digests(history: History) -> list[str]:
    """The digest of the state after each step of `history`, as the replay reaches it."""
    marked = dataclasses.replace(
        history, steps=tuple(dataclasses.replace(cs, digest="?") for cs in history.steps)
    )
    digests: list[str] = []

    def keep(_: CommittedStep, __: object, applied: Any) -> None:
        digests.append(applied.digest)

    replay(marked, keep)
    return digests


def _replicas_with(history: History) -> dict[str, FlatState]:
    """Three replicas that all ended in the state `history` leads to."""
    state = replay(history)
    return {f"replica {r}": state for r in range(3)}


def _renumbered(steps: list[CommittedStep]) -> History:
    return History(
        workload=WORKLOAD,
        steps=tuple(dataclasses.replace(cs, step=i) for i, cs in enumerate(steps)),
    )


def test_the_replay_is_ddp_arithmetic() -> None:
    """Independently: per-replica gradients, a sum in REDUCE_DTYPE with zeros for
    healers, a division by the participant count, one Adam step per committed step;
    bit for bit."""
    history = _history()
    model, optim = WORKLOAD.build()
    for cs in history.steps:
        buckets = [torch.zeros_like(p, dtype=REDUCE_DTYPE) for p in model.parameters()]
        for replica in range(3):
            if not any(b.replica == replica for b in cs.batches):
                continue  # a healer's bucket is zeros
            model.zero_grad()
            x, y = WORKLOAD.batch(replica, cs.step)
            WORKLOAD.loss(model(x), y).backward()
            for bucket, p in zip(buckets, model.parameters(), strict=True):
                assert p.grad is not None
                bucket += p.grad
        for bucket, p in zip(buckets, model.parameters(), strict=True):
            p.grad = (bucket / cs.divisor).to(p.dtype)
        optim.step()
    assert replay(history) == flat_state(model, optim)


def test_a_float64_sum_of_float32_values_is_the_same_in_any_order() -> None:
    """Why the replay can follow the replicas bit for bit: the ring's order does not
    matter in REDUCE_DTYPE, where it does in float32."""
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(4096, generator=gen) * 10.0**k for k in (-3, 0, 2, 1)]

    def total(order: list[int], dtype: torch.dtype) -> torch.Tensor:
        acc = torch.zeros(4096, dtype=dtype)
        for i in order:
            acc += values[i].to(dtype)
        return acc.div_(4).float()

    assert torch.equal(total([0, 1, 2, 3], REDUCE_DTYPE), total([3, 2, 1, 0], REDUCE_DTYPE))
    assert not torch.equal(total([0, 1, 2, 3], torch.float32), total([3, 2, 1, 0], torch.float32))


def test_the_true_history_passes() -> None:
    history = _with_losses(_history())
    verdict = check(history, _replicas_with(history))
    assert verdict.ok, verdict.failures
    assert verdict.steps_replayed == 6
    assert verdict.max_error == 0.0 and verdict.max_loss_error == 0.0


def test_a_dropped_step_is_caught_although_every_replica_agrees() -> None:
    recorded = _with_losses(_history())
    steps = list(recorded.steps)
    lived = _with_losses(_renumbered(steps[:3] + steps[4:]))  # step 3's update never applied
    verdict = check(recorded, _replicas_with(lived))
    assert not verdict.ok
    assert any("the optimizer took 5 steps, the committed history 6" in f for f in verdict.failures)
    assert any("final state differs" in f for f in verdict.failures)


def test_a_doubled_step_is_caught_although_every_replica_agrees() -> None:
    recorded = _history()
    steps = list(recorded.steps)
    lived = _renumbered([*steps[:4], steps[3], *steps[4:]])  # step 3 applied twice
    verdict = check(recorded, _replicas_with(lived))
    assert not verdict.ok
    assert any("the optimizer took 7 steps, the committed history 6" in f for f in verdict.failures)


def test_the_losses_name_the_first_step_that_left_the_history() -> None:
    """Replicas that skipped step 3 report, at step 4, losses of the wrong state."""
    recorded = _history()
    steps = list(recorded.steps)
    lived = _with_losses(_renumbered(steps[:3] + steps[4:]))
    # What the replicas reported: the recorded participants, with the losses they saw.
    before = _with_losses(recorded).steps[:4]  # identical up to step 3's update
    after = tuple(dataclasses.replace(cs, step=cs.step + 1) for cs in lived.steps[3:])
    reported = dataclasses.replace(recorded, steps=before + after)
    verdict = check(reported, _replicas_with(lived))
    assert any(f.startswith("step 4 (e/1): replica 0 reported loss") for f in verdict.failures)


def test_the_digests_name_the_first_step_whose_committed_state_is_wrong() -> None:
    """The replicas counted the healer at step 3 (dividing by 3, not 2) and reported
    the digests of what they then held: step 3 is named, bit for bit."""
    recorded = _history()
    steps = list(recorded.steps)
    steps[3] = dataclasses.replace(steps[3], divisor=3)
    lived = _renumbered(steps)
    reported = dataclasses.replace(
        recorded,
        steps=tuple(
            dataclasses.replace(cs, digest=d)
            for cs, d in zip(recorded.steps, _digests(lived), strict=True)
        ),
    )
    verdict = check(reported, _replicas_with(lived))
    assert verdict.failures[0].startswith("step 3 (e/1): the replicas committed a state with")
    truthful = dataclasses.replace(
        recorded,
        steps=tuple(
            dataclasses.replace(cs, digest=d)
            for cs, d in zip(recorded.steps, _digests(recorded), strict=True)
        ),
    )
    assert check(truthful, _replicas_with(recorded)).ok


def test_a_wrong_divisor_is_caught() -> None:
    """Counting the healer at step 3 (dividing by 3, not 2) gives another state."""
    recorded = _history()
    steps = list(recorded.steps)
    steps[3] = dataclasses.replace(steps[3], divisor=3)
    verdict = check(recorded, _replicas_with(_renumbered(steps)))
    assert any("final state differs" in f for f in verdict.failures)


def test_a_history_with_a_gap_or_no_participant_is_refused() -> None:
    history = _history()
    gap = dataclasses.replace(history, steps=history.steps[:2] + history.steps[3:])
    assert any("not contiguous" in f for f in check(gap, {}).failures)
    empty = list(history.steps)
    empty[1] = dataclasses.replace(empty[1], batches=())
    verdict = check(dataclasses.replace(history, steps=tuple(empty)), {})
    assert any("with no participant" in f for f in verdict.failures)
