"""What a replica group tells the lighthouse about silent data corruption (no sockets).

A rank whose integrity check finds its own group's state (or its heal source's)
corrupt, or no majority, leaves an `IntegrityReport` for the lighthouse; its
next quorum request, only that one, carries it; a manager server folds its
ranks' reports into the group's one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
import torch

from lighthouse import ManagerQuorumRequest
from lighthouse.replica.group_rounds import group_integrity
from lighthouse.types import IntegrityKind, IntegrityReport
from lighthouse.validate import MAX_INTEGRITY_TENSORS, MAX_TENSOR_NAME_CHARS
from tests.unit.manager_fakes import make, result
from torchft_pg.manager.fingerprint import Fingerprint, absent_vector, fingerprint_state
from torchft_pg.manager.integrity_check import IntegrityCheck, _reported_names
from torchft_pg.manager.state_verdict import judge
from torchft_pg.manager.step_state import StepState


def state(corrupt: bool = False) -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    sd = model.state_dict()
    if corrupt:
        with torch.no_grad():
            sd["1.weight"].view(-1).view(torch.int32)[1] ^= 1 << 20
    return {"default": {"model": sd}}


def check_for(step_state: StepState) -> IntegrityCheck:
    """An integrity check whose verdicts are acted on directly (`_act`): nothing
    is exchanged, so it needs no process group, notices or healer."""
    return IntegrityCheck(
        state=step_state,
        pg=cast(Any, None),
        notices=cast(Any, None),
        healer=cast(Any, None),
        every=3,
        timeout=timedelta(seconds=1),
    )


def step_state(replica_rank: int, members: int, heal_source: int | None = None) -> StepState:
    s = StepState(group_rank=0, replica_id=f"g{replica_rank}")
    s.max_step = 6
    s.replica_rank = replica_rank
    s.replica_ids = tuple(f"g{r}" for r in range(members))
    s.heal_source = heal_source
    return s


def vectors(*fingerprints: Fingerprint | None) -> list[list[int]]:
    return [(absent_vector() if f is None else f.vector()).tolist() for f in fingerprints]


def test_a_rank_that_finds_its_own_group_corrupt_leaves_a_diverged_report() -> None:
    good, bad = fingerprint_state(state()), fingerprint_state(state(corrupt=True))
    s = step_state(replica_rank=1, members=3)
    check_for(s)._act(judge(vectors(good, bad, good)), bad)
    assert s.integrity_report == IntegrityReport(
        step=6, kind=IntegrityKind.DIVERGED, tensors=("default/model/1.weight",)
    )
    assert s.errored() is not None  # and the step votes no


def test_a_rank_in_the_majority_reports_nothing() -> None:
    good, bad = fingerprint_state(state()), fingerprint_state(state(corrupt=True))
    s = step_state(replica_rank=0, members=3)
    check_for(s)._act(judge(vectors(good, bad, good)), good)
    assert s.integrity_report is None and s.errored() is None


def test_a_healer_whose_source_is_corrupt_reports_its_source_without_names() -> None:
    good, bad = fingerprint_state(state()), fingerprint_state(state(corrupt=True))
    s = step_state(replica_rank=1, members=4, heal_source=2)
    check_for(s)._act(judge(vectors(good, None, bad, good)), None)
    assert s.integrity_report == IntegrityReport(
        step=6, kind=IntegrityKind.HEAL_SOURCE_DIVERGED, tensors=()
    )


def test_without_a_majority_every_rank_reports_it() -> None:
    good, bad = fingerprint_state(state()), fingerprint_state(state(corrupt=True))
    for rank, mine in ((0, good), (1, bad)):
        s = step_state(replica_rank=rank, members=2)
        check_for(s)._act(judge(vectors(good, bad)), mine)
        assert s.integrity_report == IntegrityReport(
            step=6, kind=IntegrityKind.NO_MAJORITY, tensors=("default/model/1.weight",)
        )


def test_reported_names_are_few_short_and_printable() -> None:
    long = "x" * (MAX_TENSOR_NAME_CHARS + 50)
    sd = {f"t{i}": torch.zeros(1) for i in range(MAX_INTEGRITY_TENSORS + 3)}
    sd["a\nb"] = torch.zeros(1)
    sd[long] = torch.zeros(1)
    fp = fingerprint_state(sd)
    names = _reported_names(fp, tuple(range(len(fp.names))))
    assert len(names) == MAX_INTEGRITY_TENSORS
    assert all(n.isprintable() and 0 < len(n) <= MAX_TENSOR_NAME_CHARS for n in names)
    two = fingerprint_state({"a\nb": torch.zeros(1), long: torch.zeros(1)})
    assert _reported_names(two, (0, 1)) == ("a\\nb", "x" * MAX_TENSOR_NAME_CHARS)
    assert _reported_names(None, (0, 1)) == ()


def test_the_next_quorum_request_and_only_that_one_carries_the_report() -> None:
    manager, client, _, _ = make(
        [result(replica_rank=0, max_step=s, max_world=1) for s in (0, 1, 2)],
    )
    manager.register_state_dict_fn("default", lambda sd: None, lambda: {})
    report = IntegrityReport(step=0, kind=IntegrityKind.DIVERGED, tensors=("w",))
    for i in range(3):
        manager.start_quorum()
        manager.wait_quorum()
        if i == 0:
            manager._state.integrity_report = report  # as the check leaves it
        manager.should_commit()
    first, second, third = client.requests
    assert first.integrity is None
    assert second.integrity == report
    assert third.integrity is None  # reported once
    manager.shutdown()


def req(rank: int, integrity: IntegrityReport | None) -> ManagerQuorumRequest:
    return ManagerQuorumRequest(
        group_rank=rank,
        step=7,
        checkpoint_metadata="",
        timeout=timedelta(seconds=1),
        commit_failures=1,
        integrity=integrity,
    )


def report(step: int, kind: IntegrityKind, *tensors: str) -> IntegrityReport:
    return IntegrityReport(step=step, kind=kind, tensors=tensors)


D, H, N = (
    IntegrityKind.DIVERGED,
    IntegrityKind.HEAL_SOURCE_DIVERGED,
    IntegrityKind.NO_MAJORITY,
)


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        ([None, None], None),
        ([None, report(6, D, "b")], report(6, D, "b")),
        # each rank checks its shard: the group's own divergence comes first, and
        # the names its ranks gave for it, in group-rank order, each once
        (
            [report(6, N, "n"), report(6, D, "b", "a"), report(6, D, "a", "c")],
            report(6, D, "b", "a", "c"),
        ),
        ([report(6, H), report(6, N, "n")], report(6, H)),
        # the latest step's finding wins
        ([report(9, N, "n"), report(6, D, "b")], report(9, N, "n")),
        (
            [
                report(6, D, *(f"t{i}" for i in range(6))),
                report(6, D, *(f"u{i}" for i in range(6))),
            ],
            report(6, D, *(f"t{i}" for i in range(6)), "u0", "u1"),
        ),
    ],
)
def test_a_group_reports_one_finding_from_its_ranks(
    reports: list[IntegrityReport | None], expected: IntegrityReport | None
) -> None:
    # the ranks arrive in any order; the group rank orders them
    reqs = [req(r, x) for r, x in reversed(list(enumerate(reports)))]
    assert group_integrity(reqs) == expected
