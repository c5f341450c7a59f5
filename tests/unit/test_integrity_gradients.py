"""The integrity check of the averaged gradients (no sockets).

The option is validated; at a checked step each allreduce result is digested
after the division, in call order whatever order the ops complete in; at any
other step nothing is; a group whose averaged gradient differs from the
majority's votes no and reports `GRADIENT_DIVERGED`, which the lighthouse
records without counting it toward quarantine.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
import torch
from torch.distributed import ReduceOp

from lighthouse import ManagerQuorumRequest
from lighthouse.coordinator.integrity import DivergenceLog
from lighthouse.replica.group_rounds import group_integrity
from lighthouse.types import IntegrityKind, IntegrityReport
from tests.unit.manager_fakes import make, result
from torchft_pg.errors import StateDivergedError
from torchft_pg.manager.fingerprint import Fingerprint, absent_vector, tensor_digest
from torchft_pg.manager.gradient_digests import GradientDigests, check_gradients, result_name
from torchft_pg.manager.integrity_check import IntegrityCheck
from torchft_pg.manager.state_verdict import judge
from torchft_pg.manager.step_state import StepState

EVERY = 3


# -- the option -----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1, 0, "yes", None, 1.0])
def test_the_option_must_be_a_bool_and_the_error_names_the_bad_value(bad: Any) -> None:
    with pytest.raises(
        ValueError, match=f"integrity_check_gradients must be True or False.*got {bad!r}"
    ):
        check_gradients(bad)
    with pytest.raises(ValueError, match=f"integrity_check_gradients .* got {bad!r}"):
        make([result()], integrity_check_gradients=bad)


def test_the_option_is_off_by_default_and_the_setter_validates_too() -> None:
    assert check_gradients(True) is True and check_gradients(False) is False
    manager, *_ = make([result()])
    assert manager._integrity.gradient_digests.enabled is False
    manager.set_integrity_check_gradients(True)
    assert manager._integrity.gradient_digests.enabled is True
    with pytest.raises(ValueError, match="got 'on'"):
        manager.set_integrity_check_gradients("on")  # type: ignore[arg-type]
    assert manager._integrity.gradient_digests.enabled is True  # unchanged
    manager.shutdown()


# -- what is digested -----------------------------------------------------------------
def averaged_at(max_step: int, gradients: bool) -> tuple[torch.Tensor, Fingerprint | None]:
    """One allreduce (AVG over 2 participants) at a step whose quorum's max step is
    `max_step`; returns its result and the digests the step collected."""
    manager, _, _, _ = make(
        [result(max_step=max_step, world=2)],
        integrity_check_every=EVERY,
        integrity_check_gradients=gradients,
    )
    manager.start_quorum()
    t = torch.tensor([1.0, 2.0, 3.0])
    manager.allreduce(t).wait()  # the fake group sums two equal contributions
    taken = manager._integrity.gradient_digests.take()
    manager.shutdown()
    return t, taken


def test_at_a_checked_step_the_result_after_the_division_is_digested() -> None:
    t, taken = averaged_at(max_step=2 * EVERY, gradients=True)
    assert t.tolist() == [1.0, 2.0, 3.0]  # what the optimizer applies
    assert taken is not None
    assert taken.names == ("averaged gradient bucket 0 (3 float32 values)",)
    assert taken.digests == (int(tensor_digest(t)),)


@pytest.mark.parametrize(
    ("max_step", "gradients"), [(2 * EVERY + 1, True), (0, True), (2 * EVERY, False)]
)
def test_nothing_is_digested_on_an_unchecked_step_or_with_the_option_off(
    max_step: int, gradients: bool
) -> None:
    _, taken = averaged_at(max_step, gradients)
    assert taken is None if not gradients else taken is not None and taken.names == ()


def digests(enabled: bool = True, due: bool = True) -> GradientDigests:
    return GradientDigests(due=lambda: due, enabled=enabled)


def test_results_are_keyed_by_call_order_not_completion_order() -> None:
    first, second = torch.full((4,), 0.5), torch.full((2,), 7.0, dtype=torch.float64)
    d = digests()
    d.begin_step()
    a, b = d.slot(), d.slot()
    assert a is not None and b is not None
    d.record(b, second, ReduceOp.AVG)  # the second op completes first
    d.record(a, first, ReduceOp.AVG)
    taken = d.take()
    assert taken is not None
    assert taken.names == (
        "averaged gradient bucket 0 (4 float32 values)",
        "averaged gradient bucket 1 (2 float64 values)",
    )
    assert taken.digests == (int(tensor_digest(first)), int(tensor_digest(second)))
    assert d.take() == Fingerprint(names=(), digests=())  # taken once


def test_a_late_result_of_an_earlier_step_is_dropped() -> None:
    d = digests()
    d.begin_step()
    late = d.slot()
    assert late is not None
    d.begin_step()
    d.record(late, torch.ones(2), ReduceOp.AVG)
    assert d.take() == Fingerprint(names=(), digests=())


def test_a_change_of_the_option_applies_from_the_next_step() -> None:
    d = digests(enabled=False)
    d.begin_step()
    d.enabled = True
    assert d.slot() is None and d.take() is None  # not mid-step
    d.begin_step()
    assert d.slot() == (d._generation, 0)
    assert digests(due=False).slot() is None


def test_other_ops_are_named_by_their_op() -> None:
    t = torch.zeros(5, dtype=torch.bfloat16)
    assert result_name(2, t, ReduceOp.SUM) == "allreduce result 2 (SUM of 5 bfloat16 values)"
    assert (
        result_name(2, t, ReduceOp(ReduceOp.MAX)) == "allreduce result 2 (MAX of 5 bfloat16 values)"
    )
    assert result_name(0, t, ReduceOp(ReduceOp.AVG)).startswith("averaged gradient bucket 0")


# -- what a finding does ------------------------------------------------------------------
def check_for(s: StepState) -> IntegrityCheck:
    """A check whose verdicts are acted on directly: nothing is exchanged."""
    return IntegrityCheck(
        state=s,
        pg=cast(Any, None),
        notices=cast(Any, None),
        healer=cast(Any, None),
        every=EVERY,
        timeout=timedelta(seconds=1),
        gradients=True,
    )


def step_state(replica_rank: int, members: int) -> StepState:
    s = StepState(group_rank=0, replica_id=f"g{replica_rank}")
    s.max_step = 2 * EVERY
    s.replica_rank = replica_rank
    s.replica_ids = tuple(f"g{r}" for r in range(members))
    return s


def bucket(value: float) -> Fingerprint:
    d = digests()
    d.begin_step()
    slot = d.slot()
    assert slot is not None
    d.record(slot, torch.full((3,), value), ReduceOp.AVG)
    taken = d.take()
    assert taken is not None
    return taken


def vectors(*fingerprints: Fingerprint | None) -> list[list[int]]:
    return [(absent_vector() if f is None else f.vector()).tolist() for f in fingerprints]


def test_a_group_with_a_differing_averaged_gradient_votes_no_and_reports_it() -> None:
    good, bad = bucket(0.25), bucket(0.2500001)
    s = step_state(replica_rank=1, members=3)
    check = check_for(s)
    check._act_on_gradients(judge(vectors(good, bad, good)), bad, report=True)
    assert s.integrity_report == IntegrityReport(
        step=2 * EVERY,
        kind=IntegrityKind.GRADIENT_DIVERGED,
        tensors=("averaged gradient bucket 0 (3 float32 values)",),
    )
    error = s.errored()
    assert error is not None and isinstance(error.original_exception, StateDivergedError)
    assert "averaged gradient differs" in str(error.original_exception)
    assert check.gradient_divergences == 1 and check.divergences == 0


def test_the_majority_and_a_healer_that_agrees_report_nothing() -> None:
    good, bad = bucket(0.25), bucket(0.5)
    for rank in (0, 2):  # rank 2 healed this step: its state is absent, its gradient not
        s = step_state(replica_rank=rank, members=3)
        check_for(s)._act_on_gradients(judge(vectors(good, bad, good)), good, report=True)
        assert s.integrity_report is None and s.errored() is None


def test_a_state_finding_of_the_same_check_is_the_one_reported() -> None:
    good, bad = bucket(0.25), bucket(0.5)
    s = step_state(replica_rank=1, members=3)
    check_for(s)._act_on_gradients(judge(vectors(good, bad, good)), bad, report=False)
    assert s.integrity_report is None and s.errored() is not None


def test_gradients_without_a_majority_fail_every_group() -> None:
    a, b = bucket(0.25), bucket(0.5)
    for rank, mine in ((0, a), (1, b)):
        s = step_state(replica_rank=rank, members=2)
        check_for(s)._act_on_gradients(judge(vectors(a, b)), mine, report=True)
        assert s.integrity_report is not None
        assert s.integrity_report.kind is IntegrityKind.NO_MAJORITY
        assert s.integrity_report.tensors == ("averaged gradient bucket 0 (3 float32 values)",)
        assert s.errored() is not None


# -- what the lighthouse makes of it --------------------------------------------------------
def request(rank: int, report: IntegrityReport | None) -> ManagerQuorumRequest:
    return ManagerQuorumRequest(
        group_rank=rank,
        step=6,
        checkpoint_metadata="",
        timeout=timedelta(seconds=1),
        integrity=report,
    )


def test_a_group_reports_its_own_state_before_its_gradient_before_its_heal_source() -> None:
    state = IntegrityReport(step=6, kind=IntegrityKind.DIVERGED, tensors=("w",))
    grad = IntegrityReport(step=6, kind=IntegrityKind.GRADIENT_DIVERGED, tensors=("b",))
    source = IntegrityReport(step=6, kind=IntegrityKind.HEAL_SOURCE_DIVERGED)
    assert group_integrity([request(0, grad), request(1, state)]) == state
    assert group_integrity([request(0, source), request(1, grad)]) == grad


def test_a_gradient_divergence_is_recorded_but_not_counted_toward_quarantine() -> None:
    log = DivergenceLog()
    report = IntegrityReport(step=6, kind=IntegrityKind.GRADIENT_DIVERGED, tensors=("b",))
    assert log.reported("g1", report, now=0.0)
    assert not log.reported("g1", report, now=1.0)  # the same report again
    assert log.count("g1", now=1.0, window_s=60.0) == 0
