"""The chaos ledger: per-commit invariants, and the history it hands to the oracle."""

from __future__ import annotations

from tests.chaos_support.events import Contribution, Dying, StepEnded
from tests.chaos_support.ledger import Ledger
from tests.chaos_support.workload import Workload


def _step(
    replica: int,
    step: int,
    *,
    quorum: str = "e/1",
    digest: str = "d",
    participants: int = 2,
    group_rank: int = 0,
    incarnation: int = 0,
) -> StepEnded:
    return StepEnded(
        replica=replica,
        group_rank=group_rank,
        incarnation=incarnation,
        at=0.0,
        step=step,
        committed=True,
        quorum=quorum,
        participants=participants,
        loss=1.0,
        digest=digest,
    )


def _contribution(
    replica: int, step: int, *, participating: bool = True, data_step: int | None = None
) -> Contribution:
    return Contribution(
        replica=replica,
        group_rank=0,
        incarnation=0,
        at=0.0,
        quorum="e/1",
        step=step,
        participating=participating,
        divisor=2,
        data_step=step if data_step is None else data_step,
        loss=1.0,
    )


def test_agreeing_commits_pass_and_give_the_history() -> None:
    ledger = Ledger(Workload())
    for s in range(2):
        ledger.contribution(_contribution(0, s))
        ledger.contribution(_contribution(1, s, participating=s > 0))  # healing at step 0
        ledger.step_ended(_step(0, s, digest=f"d{s}"))
        ledger.step_ended(_step(1, s, digest=f"d{s}"))
    ledger.finish()
    assert ledger.failures == []
    history, problems = ledger.history(2)
    assert problems == [] and history is not None
    assert [[b.replica for b in cs.batches] for cs in history.steps] == [[0], [0, 1]]
    assert [cs.divisor for cs in history.steps] == [2, 2]


def test_different_states_after_a_step_are_caught() -> None:
    ledger = Ledger(Workload())
    ledger.step_ended(_step(0, 3, digest="aaa"))
    ledger.step_ended(_step(1, 3, digest="bbb"))
    assert any("state after step 3 differs" in f for f in ledger.failures)


def test_one_step_in_two_quorums_is_caught() -> None:
    ledger = Ledger(Workload())
    ledger.step_ended(_step(0, 3, quorum="e/1"))
    ledger.step_ended(_step(1, 3, quorum="e/2"))
    assert any("committed in two quorums" in f for f in ledger.failures)


def test_a_step_going_backwards_is_caught() -> None:
    ledger = Ledger(Workload())
    ledger.step_ended(_step(0, 4, digest="x"))
    ledger.step_ended(_step(0, 3, digest="y"))
    assert any("went backwards" in f for f in ledger.failures)


def test_a_group_committing_a_step_its_rank_died_in_before_voting_is_caught() -> None:
    ledger = Ledger(Workload())
    ledger.death(
        Dying(replica=1, group_rank=1, incarnation=0, at=0.0, phase="allreduce_after", step=5)
    )
    ledger.step_ended(_step(1, 5))
    ledger.finish()
    assert any("died in allreduce_after" in f for f in ledger.failures)


def test_a_missing_step_or_a_stale_participant_spoils_the_history() -> None:
    ledger = Ledger(Workload())
    ledger.contribution(_contribution(0, 0))
    ledger.contribution(_contribution(1, 0, data_step=7))
    ledger.step_ended(_step(0, 0))
    history, problems = ledger.history(2)
    assert history is None
    assert any("contributed its batch of step 7" in p for p in problems)
    assert any("no replica reported committing step 1" in p for p in problems)
