"""The chaos faults that stop nothing: CORRUPT_STATE (one flipped bit) and STRAGGLE
(a slow replica), from the plan through the rank's firing to the supervisor's
schedule, ledger and oracle."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch

from tests.chaos_support.data_oracle import check_stream
from tests.chaos_support.events import Contribution, Corrupted, Release, StepEnded
from tests.chaos_support.ledger import Ledger
from tests.chaos_support.oracle import Batch, CommittedStep, Corruption, History, check
from tests.chaos_support.schedule import FaultSchedule
from tests.chaos_support.workload import (
    REDUCE_DTYPE,
    FlatState,
    Workload,
    flat_state,
    state_checksum,
    state_tensors,
)
from torchft_pg.chaos import HEALTH_FAULTS, Fault, FaultPlan, ReplicaFaults
from torchft_pg.chaos.corruption import BitFlip, apply_bit_flip, choose_bit_flip
from torchft_pg.process_group import ProcessGroupDummy

WORKLOAD = Workload(seed=5, hidden=8)

# -- the flip ---------------------------------------------------------------------


def test_a_bit_flip_is_chosen_from_its_key_and_changes_one_low_bit() -> None:
    model, optim = WORKLOAD.build()
    named = state_tensors(model, optim)
    flip = choose_bit_flip("7:1:40", named)
    assert flip == choose_bit_flip("7:1:40", state_tensors(*WORKLOAD.build()))  # same key
    assert {choose_bit_flip(f"7:1:{s}", named) for s in range(20)} != {flip}  # keys differ
    before = dict((n, t.clone()) for n, t in named)
    apply_bit_flip(flip, named)
    changed = {n for n, t in named if not torch.equal(t, before[n])}
    assert changed == {flip.tensor}
    old, new = before[flip.tensor].view(-1), dict(named)[flip.tensor].view(-1)
    assert (old != new).sum().item() == 1
    xor = int(old.view(torch.int32)[flip.index].item()) ^ int(
        new.view(torch.int32)[flip.index].item()
    )
    assert xor == 1 << flip.bit and flip.bit < 16  # a low mantissa bit: a tiny change
    ratio = abs(new[flip.index].item() / old[flip.index].item() - 1)
    assert 0 < ratio < 2**-7
    apply_bit_flip(flip, named)  # the same flip again restores the value
    assert torch.equal(dict(named)[flip.tensor], before[flip.tensor])


def test_a_flip_needs_a_float_tensor_by_that_name() -> None:
    with pytest.raises(ValueError, match="no tensor to corrupt"):
        choose_bit_flip("k", [("ids", torch.arange(4))])
    with pytest.raises(KeyError, match="'missing'"):
        apply_bit_flip(BitFlip(tensor="missing", index=0, bit=0), [("w", torch.ones(2))])


# -- the rank fires them ------------------------------------------------------------


def _faults(plan: FaultPlan, **kwargs: float | int) -> ReplicaFaults:
    faults = ReplicaFaults(plan, 0, **kwargs)  # type: ignore[arg-type]
    faults.wrap_process_group(ProcessGroupDummy())
    return faults


def test_a_corrupt_state_fault_flips_the_watched_state_once() -> None:
    model, optim = WORKLOAD.build()
    faults = _faults(FaultPlan({(0, 3): Fault.CORRUPT_STATE}, seed=9))
    with pytest.raises(RuntimeError, match="watch_state"):
        faults.fire_due(3)  # nothing named to corrupt
    faults = _faults(FaultPlan({(0, 3): Fault.CORRUPT_STATE}, seed=9))
    faults.watch_state(lambda: state_tensors(model, optim))
    before = state_checksum(model.state_dict())
    assert faults.fire_due(2) is None and state_checksum(model.state_dict()) == before
    assert faults.fire_due(3) == Fault.CORRUPT_STATE
    assert faults.last_flip == choose_bit_flip("9:0:3", state_tensors(*WORKLOAD.build()))
    after = state_checksum(model.state_dict())
    assert after != before
    assert faults.fire_due(4) is None and state_checksum(model.state_dict()) == after


def test_a_straggler_is_slow_until_its_steps_run_out_or_it_heals_back_in() -> None:
    faults = _faults(FaultPlan({(0, 2): Fault.STRAGGLE}), straggle_s=0.05, straggle_steps=3)

    def timed(step: int) -> float:
        began = time.monotonic()
        faults.fire_due(step)
        return time.monotonic() - began

    assert timed(1) < 0.05 and not faults.straggling
    assert [timed(s) >= 0.05 for s in (2, 3, 3)] == [True, True, True]  # a retried step too
    assert not faults.straggling and not faults.straggle_healed  # its 3 steps ran out
    assert timed(4) < 0.05
    faults = _faults(FaultPlan({(0, 2): Fault.STRAGGLE}), straggle_s=0.05, straggle_steps=50)
    assert timed(2) >= 0.05 and timed(3) >= 0.05 and faults.straggling
    assert timed(9) < 0.05  # left out of the quorum, it healed to step 9: keeps pace
    assert not faults.straggling and faults.straggle_healed
    with pytest.raises(ValueError, match="straggle_steps"):
        _faults(FaultPlan(), straggle_steps=0)
    with pytest.raises(ValueError, match="straggle_s"):
        _faults(FaultPlan(), straggle_s=-1.0)


def test_a_random_plan_never_overlaps_a_health_fault_and_corruption_needs_a_majority() -> None:
    kinds = [*HEALTH_FAULTS, Fault.DELAY]
    plan = FaultPlan.random(
        seed=4, replicas=4, steps=400, kills=5, other_faults=20, gap=12, kinds=kinds, overlaps=25
    )
    by_step: dict[int, list[Fault]] = {}
    for (_, step), fault in plan.faults.items():
        by_step.setdefault(step, []).append(fault)
    health = [faults for faults in by_step.values() if set(faults) & set(HEALTH_FAULTS)]
    assert health and all(len(faults) == 1 for faults in health)
    assert any(len(faults) == 2 for faults in by_step.values())  # others did overlap
    with pytest.raises(ValueError, match="CORRUPT_STATE need at least 3"):
        FaultPlan.random(seed=4, replicas=2, steps=300, kills=1, kinds=[Fault.CORRUPT_STATE])


# -- the supervisor's bookkeeping ---------------------------------------------------


def test_a_held_replica_holds_the_next_group_back_until_it_ran_its_course() -> None:
    plan = FaultPlan({(1, 4): Fault.CORRUPT_STATE, (2, 10): Fault.KILL_REPLICA})
    s = FaultSchedule(plan, replicas=3)
    s.due_messages()
    assert s.fire(1, 4, step=4)
    s.hold(1)
    for step in (5, 6, 7):
        for replica in range(3):
            s.committed(replica, step, 3)  # everyone takes part: the corruption is silent
        assert s.due_messages() == []
    s.unhold(1, step=8)  # caught and healed at step 8
    for replica in range(3):
        s.committed(replica, 8, 3)
    assert s.due_messages() == []  # not past the heal yet
    for replica in range(3):
        s.committed(replica, 9, 3)
    assert [type(m).__name__ for m in s.due_messages()] == ["Release"]


def _commit(replica: int, step: int, digest: str, incarnation: int = 0) -> StepEnded:
    return StepEnded(
        replica=replica,
        group_rank=0,
        incarnation=incarnation,
        at=0.0,
        step=step,
        committed=True,
        quorum="e/1",
        participants=3,
        loss=1.0,
        digest=digest,
    )


def _corrupted(replica: int, step: int) -> Corrupted:
    return Corrupted(
        replica=replica, group_rank=0, incarnation=0, at=0.0, step=step, tensor="t", index=0, bit=0
    )


def test_the_ledger_lets_a_corrupt_replica_differ_only_until_it_is_caught() -> None:
    ledger = Ledger(WORKLOAD, detect_within=5)
    ledger.corruption(_corrupted(1, 4))
    ledger.step_ended(_commit(1, 4, "bad4"))  # its own commit arrives first
    for replica in (0, 2):
        ledger.step_ended(_commit(replica, 4, "ok4"))
    assert ledger.failures == [] and ledger.open_corruptions() == [1]
    for replica in (0, 2):
        ledger.step_ended(_commit(replica, 5, "ok5"))
    ledger.step_ended(_commit(1, 6, "ok6"))  # voted out at 5, healed in 6
    ledger.step_ended(_commit(0, 6, "ok6"))
    assert ledger.healed == [(1, 0, 4, 6)] and ledger.open_corruptions() == []
    ledger.step_ended(_commit(1, 7, "bad7"))  # a difference after the heal is a failure again
    ledger.step_ended(_commit(0, 7, "ok7"))
    assert ledger.failures and "state after step 7 differs" in ledger.failures[0]


def test_the_ledger_fails_a_corruption_caught_late_or_never() -> None:
    late = Ledger(WORKLOAD, detect_within=5)
    late.corruption(_corrupted(2, 10))
    for step in range(10, 16):
        late.step_ended(_commit(0, step, f"ok{step}"))
        late.step_ended(_commit(2, step, f"bad{step}"))
    assert len(late.failures) == 1 and "did not catch it within 5 steps" in late.failures[0]
    never = Ledger(WORKLOAD, detect_within=None)
    never.corruption(_corrupted(2, 10))
    never.step_ended(_commit(2, 10, "bad"))
    never.finish()
    assert never.failures and "never caught and healed" in never.failures[0]
    dead = Ledger(WORKLOAD, detect_within=5)
    dead.corruption(_corrupted(2, 10))
    dead.forget_replica(2)  # killed before its check: the corruption died with it
    dead.finish()
    assert dead.failures == []


# -- the oracle replays a corruption ------------------------------------------------

CORRUPT, AT, CAUGHT = 1, 2, 3  # replica 1 is corrupted at step 2, voted out at step 3
FLIP = BitFlip(tensor="model.0.weight", index=5, bit=12)


@dataclasses.dataclass
class _Job:
    history: History
    finals: dict[str, FlatState]


def _simulated_job() -> _Job:
    """Three replicas, 6 steps, simulated independently of the replay: replica 1's
    state gets FLIP before step 2, it sends gradients from that state at steps 2
    and 3, votes no at 3 (the others commit), heals from replica 0 at step 4 and
    contributes zeros there, then takes part again."""
    replicas = [WORKLOAD.build() for _ in range(3)]
    steps = []
    for step in range(6):
        if step == AT:
            apply_bit_flip(FLIP, state_tensors(*replicas[CORRUPT]))
        if step == CAUGHT + 1:  # the heal: replica 0's state, deep-copied
            model, optim = replicas[CORRUPT]
            model.load_state_dict(replicas[0][0].state_dict())
            optim.load_state_dict(copy.deepcopy(replicas[0][1].state_dict()))
        participants = [r for r in range(3) if not (r == CORRUPT and step == CAUGHT + 1)]
        total = [torch.zeros_like(p, dtype=REDUCE_DTYPE) for p in replicas[0][0].parameters()]
        batches = []
        for r in participants:
            model, optim = replicas[r]
            digest = state_checksum(model.state_dict(), optim.state_dict())
            model.zero_grad()
            x, y = WORKLOAD.batch(r, step)
            loss = WORKLOAD.loss(model(x), y)
            loss.backward()
            batches.append(
                Batch(replica=r, data_step=step, loss=float(loss.item()), state_digest=digest)
            )
            for t, p in zip(total, model.parameters(), strict=True):
                assert p.grad is not None
                t.add_(p.grad)
        averaged = [t / 3 for t in total]
        digests: dict[int, str] = {}
        for r, (model, optim) in enumerate(replicas):
            if r == CORRUPT and step == CAUGHT:
                continue  # it votes no: its state stays as it was
            for p, g in zip(model.parameters(), averaged, strict=True):
                p.grad = g.to(p.dtype)
            optim.step()
            digests[r] = state_checksum(model.state_dict(), optim.state_dict())
        steps.append(
            CommittedStep(
                step=step,
                divisor=3,
                batches=tuple(batches),
                quorum="e/1",
                digest=digests[0],
                corrupt_digests=((CORRUPT, digests[CORRUPT]),) if AT <= step < CAUGHT else (),
            )
        )
    history = History(
        workload=WORKLOAD,
        steps=tuple(steps),
        corruptions=(
            Corruption(
                replica=CORRUPT, step=AT, tensor=FLIP.tensor, index=FLIP.index, bit=FLIP.bit
            ),
        ),
    )
    return _Job(history, {f"replica {r}": flat_state(*replicas[r]) for r in range(3)})


def test_the_replay_follows_a_corrupt_replica_until_it_heals() -> None:
    job = _simulated_job()
    verdict = check(job.history, job.finals)
    assert verdict.ok, verdict.failures
    assert verdict.max_error == 0.0 and verdict.max_loss_error == 0.0


def test_a_gradient_from_an_unknown_state_or_a_wrong_corrupt_commit_is_caught() -> None:
    job = _simulated_job()
    unknown = dataclasses.replace(job.history, corruptions=())  # the flip is not declared
    verdict = check(unknown, job.finals)
    assert not verdict.ok
    assert "replica 1 took its gradient at a state with digest" in verdict.failures[0]
    steps = list(job.history.steps)
    steps[AT] = dataclasses.replace(steps[AT], corrupt_digests=((CORRUPT, "0" * 16),))
    verdict = check(dataclasses.replace(job.history, steps=tuple(steps)), job.finals)
    assert not verdict.ok
    assert f"replica {CORRUPT} committed a state with digest {'0' * 16}" in verdict.failures[0]


def test_a_contribution_event_names_the_state_it_was_taken_at() -> None:
    event = Contribution(
        replica=0,
        group_rank=0,
        incarnation=0,
        at=0.0,
        quorum="e/1",
        step=0,
        participating=True,
        divisor=3,
        data_step=0,
        loss=1.0,
        state_digest="abc",
    )
    ledger = Ledger(WORKLOAD)
    ledger.contribution(event)
    ledger.step_ended(_commit(0, 0, "x"))
    history, problems = ledger.history(1)
    assert problems == [] and history is not None
    assert [b.state_digest for b in history.steps[0].batches] == ["abc"]


def test_the_other_faults_of_a_lighthouse_group_fire_while_it_is_away() -> None:
    plan = FaultPlan(
        {(1, 4): Fault.LIGHTHOUSE_OUTAGE, (2, 4): Fault.KILL_REPLICA, (0, 9): Fault.DELAY}
    )
    s = FaultSchedule(plan, replicas=3)
    (first,) = s.due_messages()
    assert isinstance(first, Release) and first.others_after > 0
    assert s.fire(1, 4, step=4) and s.fire(2, 4, step=4 + first.others_after)
    s.hold(-1)  # the lighthouse is away: nothing more is released
    for replica in range(3):
        s.committed(replica, 20, 3)
    assert s.due_messages() == []
    s.unhold(-1, step=20)
    for replica in range(3):
        s.committed(replica, 21, 3)
    (second,) = s.due_messages()
    assert isinstance(second, Release) and second.others_after == 0  # no lighthouse fault


def test_the_data_oracle_wants_every_sample_once_per_epoch() -> None:
    assert check_stream([2, 0, 1, 1, 2, 0, 2], 3) == []
    assert "missing [1], twice [0]" in check_stream([2, 0, 0], 3)[0]  # a lost sample
    assert "epoch 1" in check_stream([2, 0, 1, 1, 1, 0], 3)[0]
    assert "unfinished epoch 1" in check_stream([2, 0, 1, 2, 2], 3)[0]  # a repeat


def test_the_ledger_orders_each_step_by_participant_then_group_rank() -> None:
    ledger = Ledger(WORKLOAD)
    for replica, rank, indices in ((1, 0, (3, 4)), (0, 1, (5, 6))):
        for g in (0, 1):
            ledger.contribution(
                Contribution(
                    replica=replica,
                    group_rank=g,
                    incarnation=0,
                    at=0.0,
                    quorum="e/1",
                    step=0,
                    participating=True,
                    divisor=2,
                    data_step=0,
                    loss=1.0,
                    participant_rank=rank,
                    indices=tuple(i + 10 * g for i in indices),
                )
            )
    for g in (0, 1):
        ledger.step_ended(dataclasses.replace(_commit(0, 0, "x"), group_rank=g))
    stream, problems = ledger.data_stream(1, group_world_size=2)
    assert problems == []
    assert stream == [3, 4, 13, 14, 5, 6, 15, 16]  # replica 1 is participant 0
