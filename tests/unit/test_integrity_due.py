"""Which steps the integrity check runs at (no sockets).

Every `every` steps, and at every step some member of the quorum heals: a
group corrupted since the last check may be the source a joiner heals from,
and only a check at that step tells the joiner to drop what it received. Both
conditions come from the quorum's result, which every member reads alike.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
import torch

from tests.unit.manager_fakes import make, result
from torchft_pg.manager.integrity_check import IntegrityCheck
from torchft_pg.manager.step_state import StepState


def check(every: int | None, max_step: int, quorum_heals: bool) -> IntegrityCheck:
    s = StepState(group_rank=0, replica_id="g0")
    s.max_step, s.quorum_heals = max_step, quorum_heals
    return IntegrityCheck(
        state=s,
        pg=cast(Any, None),
        notices=cast(Any, None),
        healer=cast(Any, None),
        every=every,
        timeout=timedelta(seconds=1),
    )


@pytest.mark.parametrize(
    ("every", "max_step", "quorum_heals", "due"),
    [
        (3, 6, False, True),  # a multiple of `every`
        (3, 7, False, False),
        (3, 7, True, True),  # someone heals at a step between two checks
        (3, 0, True, False),  # a fresh job's first sync: nothing committed to compare
        (None, 7, True, False),  # checks off: off at heals too
        (None, 6, False, False),
    ],
)
def test_a_check_is_due_every_few_steps_and_whenever_someone_heals(
    every: int | None, max_step: int, quorum_heals: bool, due: bool
) -> None:
    assert check(every, max_step, quorum_heals).due() is due


@pytest.mark.parametrize(
    ("world", "max_world", "heals"),
    [(3, 3, False), (3, 2, True), (4, 1, True)],
)
def test_the_quorum_round_says_whether_any_member_heals(
    world: int, max_world: int, heals: bool
) -> None:
    # this rank is up to date (it may be a heal source or not): the flag is the
    # quorum's, the same on the source, the healer and a bystander
    manager, *_ = make([result(world=world, max_world=max_world, max_step=7)])
    try:
        manager.start_quorum()
        manager.wait_quorum()
        assert manager._state.quorum_heals is heals
        assert manager._integrity.due() is heals  # step 7 is no multiple of the default 100
    finally:
        manager.shutdown()


def count_allgathers(pg: Any) -> list[int]:
    """Counts the exchanges issued on `pg` (the integrity check's allgather)."""
    issued = [0]
    allgather = pg.allgather

    def counting(*args: Any, **kwargs: Any) -> Any:
        issued[0] += 1
        return allgather(*args, **kwargs)

    pg.allgather = counting
    return issued


@pytest.mark.parametrize("failed_before_allreduce", [True, False])
def test_a_step_that_skipped_an_allreduce_does_not_join_the_exchange(
    failed_before_allreduce: bool,
) -> None:
    # Peers that issued the allreduce this step skipped would meet the exchange in
    # its place and hang until their timeout; a step that failed after its
    # allreduces still joins (with an absent fingerprint), so nobody waits for it.
    manager, _, _, pg = make([result(world=2, max_world=1, max_step=7)])
    issued = count_allgathers(pg)
    try:
        manager.start_quorum()
        manager.wait_quorum()
        if failed_before_allreduce:
            manager._state.report_error(RuntimeError("a failure before the allreduce"))
        manager.allreduce(torch.ones(3)).wait()
        if not failed_before_allreduce:
            manager._state.report_error(RuntimeError("a failure after the allreduce"))
        assert manager._state.skipped_collectives is failed_before_allreduce
        assert manager.should_commit() is False
        assert issued[0] == (0 if failed_before_allreduce else 1)
        manager.start_quorum()  # a new step: nothing skipped yet
        assert manager._state.skipped_collectives is False
    finally:
        manager.shutdown()
