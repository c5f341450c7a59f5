"""Silent data corruption is caught: replica groups compare fingerprints of their
state every few steps, and a group whose state differs is voted out and healed.

Ranks run as threads of this process, each replica group on its own TCPStore,
against a real lighthouse, over real gRPC and Gloo. One group's parameter has
one bit flipped between two steps (as a faulty memory would); within
`EVERY` steps the check must catch it, that group must vote no, heal from a
majority member, and every group must end bit-identical; the lighthouse's
`/status` shows the finding the corrupt group reported. With two groups that
disagree there is no majority: no step commits, and the log and `/status` say why.

With `integrity_check_gradients`, one group's process group flips a bit of
the summed gradient bucket it received at a checked step (a corrupt
reduction, injected below the Manager in `CorruptingGloo`): that group must
vote no at that very step, heal, and end bit-identical to the others, whose
steps commit. Without the option the same fault goes unnoticed at that step,
lands in the corrupt group's state, and only the next state check finds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore, Work
from torch.futures import Future

from lighthouse import LighthouseServer
from tests.threads import run_in_threads
from torchft_pg import DistributedDataParallel, OptimizerWrapper, ProcessGroupGloo
from torchft_pg._torch_internals import work_from_future
from torchft_pg.manager import Manager

EVERY = 3  # steps between checks
STEPS = 9
CORRUPT_AT = 4  # the corrupt group flips a bit after committing this step
TIMEOUT = timedelta(seconds=30)
MAX_ITERATIONS = 40  # bounds every loop: a livelock fails here instead of hanging


def poll(condition: Callable[[], bool]) -> bool:
    """Whether `condition` came true within TIMEOUT (checked every 10 ms): for a fact
    only the lighthouse's status tells, which no event announces."""
    deadline = time.monotonic() + TIMEOUT.total_seconds()
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def new_store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


class CorruptingGloo(ProcessGroupGloo):
    """Gloo whose next allreduce, once `arm`ed, delivers its result with one bit
    of the first element flipped: a reduction corrupted on its way to this rank
    (a faulty NIC, host memory or kernel), after every peer summed correctly."""

    def __init__(self, timeout: timedelta) -> None:
        super().__init__(timeout=timeout)
        self._armed = False
        self.flipped = 0  # allreduce results corrupted so far

    def arm(self) -> None:
        self._armed = True

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        work = super()._run(op, outputs, *args)
        if op != "allreduce" or not self._armed:
            return work
        self._armed = False

        def flip(done: Future[Any]) -> Any:
            result = done.value()  # raises the op's error, if any, unchanged
            with torch.no_grad():
                outputs[0].view(-1).view(torch.int32)[0] ^= 1 << 22  # a high mantissa bit
            self.flipped += 1
            return result

        return work_from_future(work.get_future().then(flip))


def run_rank(
    lighthouse: str,
    store: TCPStore,
    replica: int,
    rank: int,
    ranks: int,
    corrupt: bool,
    steps: int,
    max_iterations: int = MAX_ITERATIONS,
    give_up_after: int | None = None,
    min_replica_size: int = 1,
    check_gradients: bool = False,
    corrupt_gradient_at: int | None = None,
    every: int = EVERY,
    flipped: threading.Event | None = None,
    start_after: threading.Event | None = None,
    wait_at: tuple[int, Callable[[], bool]] | None = None,
) -> dict[str, Any]:
    """One rank of group `replica`: train until its step reaches `steps` (or
    `max_iterations` attempts, or `give_up_after` discarded attempts at one
    step); a `corrupt` rank flips one bit of its second layer's weight once it
    has committed step CORRUPT_AT. With `corrupt_gradient_at`, this rank's
    first gradient reduction at that step is delivered with a bit flipped
    (`CorruptingGloo`); `check_gradients` is `integrity_check_gradients`,
    `every` is `integrity_check_every`. A corrupt rank sets `flipped` once it
    flipped its bit; a rank given `start_after` waits for that event before it
    joins; any other rank given `wait_at` = (step, condition) waits until the
    condition holds before it trains that step."""
    if start_after is not None:
        assert start_after.wait(TIMEOUT.total_seconds()), "the event to start after never came"
    pg = CorruptingGloo(TIMEOUT)
    manager = Manager(
        pg,
        min_replica_size=min_replica_size,
        rank=rank,
        world_size=ranks,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{replica}",
        timeout=TIMEOUT,
        quorum_timeout=TIMEOUT,
        connect_timeout=TIMEOUT,
        integrity_check_every=every,
        integrity_check_gradients=check_gradients,
    )
    torch.manual_seed(0)
    hidden, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)
    model = torch.nn.Sequential(hidden, head)
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def load(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager.set_state_dict_fns(
        load, lambda: {"model": model.state_dict(), "optim": inner.state_dict()}
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner)
    iterations = 0
    flipped_at: int | None = None
    discarded_at: list[int] = []
    try:
        while manager.current_step() < steps and iterations < max_iterations:
            if corrupt and flipped_at is None and manager.current_step() == CORRUPT_AT:
                with torch.no_grad():
                    head.weight.view(-1).view(torch.int32)[5] ^= 1 << 20
                flipped_at = CORRUPT_AT
                if flipped is not None:
                    flipped.set()
            if start_after is None and wait_at is not None and manager.current_step() == wait_at[0]:
                assert poll(wait_at[1]), "the joiner's request never reached the lighthouse"
            if manager.current_step() == corrupt_gradient_at and pg.flipped == 0:
                pg.arm()
            iterations += 1
            optimizer.zero_grad()
            step = manager.current_step()
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 * step + rank))
            ddp(x).pow(2).mean().backward()
            optimizer.step()
            if manager.current_step() == step:
                discarded_at.append(step)
                if give_up_after is not None and discarded_at.count(step) >= give_up_after:
                    break
        return {
            "step": manager.current_step(),
            "discarded_at": discarded_at,
            "divergences": manager._integrity.divergences,
            "gradient_divergences": manager._integrity.gradient_divergences,
            "gradients_flipped": pg.flipped,
            "params": [p.detach().clone() for p in model.parameters()],
        }
    finally:
        manager.shutdown(wait=False)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("use_groups_ranks", [(3, 1), (3, 2)], ids=["3x1", "3x2"])
def test_a_corrupt_group_is_voted_out_and_healed_from_the_majority(
    use_groups_ranks: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    groups, ranks = use_groups_ranks
    caplog.set_level(logging.WARNING, logger="torchft_pg.manager.integrity_check")
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=groups, join_timeout_ms=60_000, http_bind=None
    )
    stores = [new_store() for _ in range(groups)]
    corrupt_group = 1
    try:
        results = run_in_threads(
            [
                (
                    lambda g=g, r=r: run_rank(  # type: ignore[misc]
                        lighthouse.address(),
                        stores[g],
                        g,
                        r,
                        ranks,
                        corrupt=(g == corrupt_group and r == 0),
                        steps=STEPS,
                    )
                )
                for g in range(groups)
                for r in range(ranks)
            ],
            timeout_s=200,
        )
        status = lighthouse.status()
    finally:
        lighthouse.shutdown()
    by_key = {(g, r): results[g * ranks + r] for g in range(groups) for r in range(ranks)}
    for key, res in by_key.items():
        assert res["step"] == STEPS, f"group/rank {key} stopped at step {res['step']}"
    # caught at the first check after the flip (step 6), by the corrupt rank itself
    caught = (CORRUPT_AT // EVERY + 1) * EVERY
    assert by_key[(corrupt_group, 0)]["divergences"] >= 1
    assert caught in by_key[(corrupt_group, 0)]["discarded_at"]
    for g in range(groups):
        if g != corrupt_group:
            assert by_key[(g, 0)]["divergences"] == 0
    for r in range(ranks):
        for g in range(1, groups):
            for a, b in zip(by_key[(0, r)]["params"], by_key[(g, r)]["params"], strict=True):
                assert torch.equal(a, b), f"groups 0 and {g} differ at rank {r}"
    lines = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(
        "silent data corruption: replica group1" in line
        and f"at step {caught}" in line
        and "group rank 0" in line
        and "1.weight" in line
        for line in lines
    ), lines
    # the corrupt group told the lighthouse, once: /status and its timeline show it
    (finding,) = status["recent_integrity_findings"]
    assert finding["replica_id"].startswith("group1") and finding["kind"] == "diverged"
    assert finding["step"] == caught and any("1.weight" in t for t in finding["tensors"])
    events = [e for e in status["history"]["timeline"] if e["kind"] == "integrity"]
    assert [(e["replica_ids"], e["step"]) for e in events] == [([finding["replica_id"]], caught)]
    assert status["quarantined"] == []  # once is not a repeat offence


@pytest.mark.timeout(240)
def test_two_groups_that_disagree_stop_committing_and_say_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="torchft_pg.manager.integrity_check")
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=60_000, http_bind=None
    )
    stores = [new_store() for _ in range(2)]
    attempts = 4  # attempts beyond the corruption: none may commit
    try:
        results = run_in_threads(
            [
                (
                    lambda g=g: run_rank(  # type: ignore[misc]
                        lighthouse.address(),
                        stores[g],
                        g,
                        0,
                        1,
                        corrupt=(g == 1),
                        steps=STEPS,
                        give_up_after=attempts,
                        min_replica_size=2,  # neither group commits alone once the other stops
                    )
                )
                for g in range(2)
            ],
            timeout_s=200,
        )
        status = lighthouse.status()
    finally:
        lighthouse.shutdown()
    caught = (CORRUPT_AT // EVERY + 1) * EVERY
    for res in results:
        assert res["step"] == caught, res["step"]
        assert res["discarded_at"].count(caught) == attempts
    lines = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(
        "no majority" in line and "stops committing" in line and f"at step {caught}" in line
        for line in lines
    ), lines
    # both groups told the lighthouse there is no majority (each once: the same
    # finding at every retry of the step is recorded once)
    findings = status["recent_integrity_findings"]
    assert {f["kind"] for f in findings} == {"no_majority"}
    assert {f["step"] for f in findings} == {caught}
    assert sorted(f["replica_id"].split(":")[0] for f in findings) == ["group0", "group1"]


GRADIENT_AT = 2 * EVERY  # a checked step: the corrupt reduction happens there


def run_groups(
    groups: int, ranks: int, steps: int, check_gradients: bool
) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[str, Any]]:
    """Train `groups` replica groups of `ranks` ranks to `steps` against a real
    lighthouse; rank 0 of group 1 receives a corrupt reduction at GRADIENT_AT.
    Returns each (group, rank)'s result and the lighthouse's `/status`."""
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=groups, join_timeout_ms=60_000, http_bind=None
    )
    stores = [new_store() for _ in range(groups)]
    try:
        results = run_in_threads(
            [
                (
                    lambda g=g, r=r: run_rank(  # type: ignore[misc]
                        lighthouse.address(),
                        stores[g],
                        g,
                        r,
                        ranks,
                        corrupt=False,
                        steps=steps,
                        check_gradients=check_gradients,
                        corrupt_gradient_at=GRADIENT_AT if (g, r) == (1, 0) else None,
                    )
                )
                for g in range(groups)
                for r in range(ranks)
            ],
            timeout_s=200,
        )
        status = lighthouse.status()
    finally:
        lighthouse.shutdown()
    return {(g, r): results[g * ranks + r] for g in range(groups) for r in range(ranks)}, status


def check_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The integrity check's own WARNING lines (not the lighthouse's)."""
    return [
        rec.getMessage()
        for rec in caplog.records
        if rec.levelno == logging.WARNING and rec.name == "torchft_pg.manager.integrity_check"
    ]


def assert_bit_identical(by_key: dict[tuple[int, int], dict[str, Any]], groups: int) -> None:
    ranks = len(by_key) // groups
    for r in range(ranks):
        for g in range(1, groups):
            for a, b in zip(by_key[(0, r)]["params"], by_key[(g, r)]["params"], strict=True):
                assert torch.equal(a, b), f"groups 0 and {g} differ at rank {r}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("use_groups_ranks", [(3, 1), (3, 2)], ids=["3x1", "3x2"])
def test_a_corrupt_reduction_is_caught_at_its_step_and_that_group_heals(
    use_groups_ranks: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    groups, ranks = use_groups_ranks
    caplog.set_level(logging.WARNING, logger="torchft_pg.manager.integrity_check")
    by_key, status = run_groups(groups, ranks, STEPS, check_gradients=True)
    corrupt = by_key[(1, 0)]
    assert corrupt["gradients_flipped"] == 1
    for key, res in by_key.items():
        assert res["step"] == STEPS, f"group/rank {key} stopped at step {res['step']}"
        assert res["divergences"] == 0, key  # no state ever differed: it was never applied
    # caught by the corrupt rank itself at the very step; its whole group voted no
    assert corrupt["gradient_divergences"] == 1
    for r in range(ranks):
        assert GRADIENT_AT in by_key[(1, r)]["discarded_at"], r
    for g in (0, 2):  # the others committed it
        for r in range(ranks):
            assert by_key[(g, r)]["gradient_divergences"] == 0
            assert GRADIENT_AT not in by_key[(g, r)]["discarded_at"], (g, r)
    assert_bit_identical(by_key, groups)  # healed from the majority
    lines = check_lines(caplog)
    assert any(
        "corrupt gradient reduction: replica group1" in line
        and "averaged gradient that differs from the majority" in line
        and f"at step {GRADIENT_AT}" in line
        and "group rank 0" in line
        and "averaged gradient bucket 0 (" in line
        for line in lines
    ), lines
    assert not any("silent data corruption" in line for line in lines), lines
    # the lighthouse was told it was the averaged gradient, once, and blames nobody
    (finding,) = status["recent_integrity_findings"]
    assert finding["replica_id"].startswith("group1") and finding["kind"] == "gradient_diverged"
    assert finding["step"] == GRADIENT_AT
    assert any(t.startswith("averaged gradient bucket 0") for t in finding["tensors"])
    assert finding["divergences_in_window"] == 0
    assert status["quarantined"] == []


@pytest.mark.timeout(240)
def test_without_the_option_a_corrupt_reduction_lands_in_the_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="torchft_pg.manager.integrity_check")
    # one state check after the corrupt step, then two steps (as in the tests above):
    # the corrupt group heals in the first, while its source is still training
    steps = GRADIENT_AT + EVERY + 3
    by_key, status = run_groups(3, 1, steps, check_gradients=False)
    corrupt = by_key[(1, 0)]
    assert corrupt["gradients_flipped"] == 1
    # nothing is caught at the corrupt step: every group commits it ...
    for key, res in by_key.items():
        assert res["step"] == steps, key
        assert res["gradient_divergences"] == 0, key
        assert GRADIENT_AT not in res["discarded_at"], key
    assert not any("gradient" in line for line in check_lines(caplog))
    # ... so the corrupt gradient was applied, and the next state check finds it
    caught = GRADIENT_AT + EVERY
    assert corrupt["divergences"] == 1 and caught in corrupt["discarded_at"]
    (finding,) = status["recent_integrity_findings"]
    assert finding["kind"] == "diverged" and finding["step"] == caught
    assert_bit_identical(by_key, 3)


@pytest.mark.timeout(240)
def test_a_joiner_healing_from_a_corrupt_group_between_checks_drops_what_it_received(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No regular check runs in this test (every 1000 steps): only the check at the
    # step a group heals. Group 0 flips a bit after step CORRUPT_AT; group 3 joins
    # after that, and heals from group 0 (the first up-to-date member in replica-id
    # order serves the first healer). Without a check at that step the joiner would
    # keep group 0's corrupt state and nothing would ever tell; with it, groups 1
    # and 2 are the majority, group 0 votes no, group 3 drops its heal, and both
    # heal from the majority at the next quorum.
    caplog.set_level(logging.WARNING, logger="torchft_pg.manager.step_state")
    groups, joiner, steps = 4, 3, CORRUPT_AT + 8
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=3, join_timeout_ms=60_000, http_bind=None
    )
    stores = [new_store() for _ in range(groups)]
    flipped = threading.Event()

    def joiner_asked() -> bool:
        # the joiner's request is at the lighthouse (which then recalls the lease):
        # the others' next rounds form a quorum with it, not run to the end without it
        pending = lighthouse.status()["next_quorum"]["pending"]
        return any(rid.startswith(f"group{joiner}:") for rid in pending)

    try:
        results = run_in_threads(
            [
                (
                    lambda g=g: run_rank(  # type: ignore[misc]
                        lighthouse.address(),
                        stores[g],
                        g,
                        0,
                        1,
                        corrupt=(g == 0),
                        steps=steps,
                        every=1000,
                        flipped=flipped,
                        start_after=flipped if g == joiner else None,
                        wait_at=(CORRUPT_AT + 1, joiner_asked),
                    )
                )
                for g in range(groups)
            ],
            timeout_s=200,
        )
        status = lighthouse.status()
    finally:
        lighthouse.shutdown()
    by_key = {(g, 0): res for g, res in enumerate(results)}
    for key, res in by_key.items():
        assert res["step"] == steps, f"group {key} stopped at step {res['step']}"
    assert by_key[(0, 0)]["divergences"] >= 1  # the corrupt source found itself out
    assert by_key[(joiner, 0)]["divergences"] >= 1  # the joiner found its source out
    for g in (1, 2):
        assert by_key[(g, 0)]["divergences"] == 0
    assert_bit_identical(by_key, groups)  # nobody kept the corrupt state
    failures = [
        rec.getMessage()
        for rec in caplog.records
        if rec.name == "torchft_pg.manager.step_state"
        and "the healed state is dropped" in rec.getMessage()
    ]
    assert failures and "replica group3" in failures[0] and "source, replica group0" in failures[0]
    kinds = {
        (f["replica_id"].split(":")[0], f["kind"]) for f in status["recent_integrity_findings"]
    }
    assert ("group0", "diverged") in kinds, kinds
