"""A lying request changes nothing durable: one test per field a request carries.

Each test runs a lighthouse core (fake clock, a real state file) with two honest
replica groups that have committed steps together, lets one request (or ping)
lie about one field, and checks that the job's committed step, the state file,
the quorum ids and epoch, the proven members and the quarantine records hold
only what the honest members did, and that the honest members still get their
next quorum. Real gRPC, the same attacks from another process:
tests/security/test_one_request_stop.py and tests/security/test_attacks.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from lighthouse import wire
from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import LighthouseCore
from lighthouse.coordinator.job_state import JobStateFile
from lighthouse.coordinator.lease import QuorumLease
from lighthouse.coordinator.quorum import QuorumConfig
from lighthouse.types import HealReport, QuorumMember

CFG = QuorumConfig(min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=5.0, lease=False)
HONEST = ("a", "b")
CLAIM = 2**62


class Job:
    """A core with honest members ``a`` and ``b`` (liveness streams open) at ``step``."""

    def __init__(self, tmp_path: Path, config: QuorumConfig = CFG) -> None:
        self.clock = FakeClock()
        self.state_file = JobStateFile(tmp_path / "lh.json", min_interval_s=0.0)
        self.core = LighthouseCore(config, self.clock, "ep", None, self.state_file)
        self.queues = {rid: asyncio.Queue[bytes]() for rid in HONEST}
        for rid, q in self.queues.items():
            self.core.stream_opened(rid, q)
        self.step = 0

    def honest_round(self, step: int, **kw: Any) -> list[str]:
        """Both honest members ask at ``step``: the replica ids of their quorum."""
        futs = [self.core.request(QuorumMember(rid, step=step, **kw)) for rid in HONEST]
        assert all(f.done() for f in futs), self.core.decision.reason
        ids = {tuple(wire.decode_lighthouse_quorum_response(f.result()).replica_ids) for f in futs}
        assert len(ids) == 1, ids
        self.step = step
        return list(ids.pop())

    def train(self, steps: int) -> None:
        for _ in range(steps):
            assert self.honest_round(self.step + 1) == list(HONEST)

    def durable(self) -> tuple[int, dict[str, Any]]:
        """The committed step, and the state file as written at a shutdown."""
        self.core.flush_job_state()
        return self.core.state.committed_step, json.loads(self.state_file.path.read_text())

    def assert_honest(self, committed: int) -> None:
        """Only what the honest members did is durable; they are the proven ones."""
        step, record = self.durable()
        assert step == committed and record["committed_step"] == committed, (step, record)
        assert record["quorum_members"] == 2, record
        assert self.core.state.proven == set(HONEST), self.core.state.proven


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def test_step_claimed_in_a_request(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(5)
        assert job.core.state.committed_step == 5
        ghost = job.core.request(QuorumMember("ghost", step=CLAIM))
        assert job.honest_round(6) == ["a", "b", "ghost"]  # taken into the quorum
        assert ghost.done()
        job.core.withdraw("ghost", ghost)  # it sends nothing more
        assert job.honest_round(7) == list(HONEST)  # refused at once (rule 9)
        job.train(2)
        job.assert_honest(9)
        assert job.core.state.quarantined["ghost"].strikes == 1

    run(body)


def test_step_claimed_in_a_liveness_ping(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(3)
        job.core.progress("a", CLAIM, 1.0)  # a member's lying ping (a buggy process of it)
        job.core.progress("b", 4, 1.0)
        job.assert_honest(4)  # b reached 4 and a claims more: together they hold 4, no more
        job.core.stream_closed("a", job.queues["a"])  # the liar vanishes: a dies
        assert job.core.state.committed_step < CLAIM
        assert "a" not in job.core.state.last_member  # rule 5 no longer waits for it

    run(body)


def test_commit_failures_zero_does_not_prove_a_member(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(3)
        job.core.request(QuorumMember("liar", step=4))
        assert job.honest_round(4) == ["a", "b", "liar"]
        job.core.request(QuorumMember("liar", step=5))  # "I committed", it says
        for rid in HONEST:  # the step failed for everyone else
            job.core.request(QuorumMember(rid, step=4, commit_failures=1))
        assert "liar" not in job.core.state.proven
        assert job.core.state.committed_step == 4  # what all three hold together

    run(body)


def test_commit_failures_cannot_set_the_quorum_id_or_the_epoch(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(2)
        before = job.core.state.quorum_id
        job.core.request(QuorumMember("liar", step=3, commit_failures=2**62))
        assert job.honest_round(3) == ["a", "b", "liar"]
        assert job.core.state.quorum_id == before + 1  # one new id, as any change makes
        assert job.core.state.prev is not None and job.core.state.prev.epoch == "ep"
        assert job.core.epoch == "ep"

    run(body)


def test_unreachable_names_cannot_cut_an_honest_member_out(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path, QuorumConfig(min_replicas=2, join_timeout_s=1.0, lease=False))
        job.train(3)
        job.core.request(QuorumMember("liar", step=CLAIM))
        job.honest_round(4)
        job.core.request(QuorumMember("liar", step=CLAIM, commit_failures=1, unreachable=("a",)))
        # a cannot reach the liar's bogus manager address either: a mutual cut; a is
        # behind the liar's claim, yet the claimant is the one cut
        job.core.request(QuorumMember("a", step=4, commit_failures=1, unreachable=("liar",)))
        quarantined = set(job.core.state.quarantined)
        assert quarantined == {"liar"}, quarantined

    run(body)


def test_a_heal_report_is_telemetry_of_its_sender_only(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(3)
        lie = HealReport(step=CLAIM, bytes_received=2**62, transfer_s=0.0)
        job.core.request(QuorumMember("liar", step=4, heal=lie))
        assert job.honest_round(4) == ["a", "b", "liar"]
        job.core.request(QuorumMember("liar", step=5))
        assert job.honest_round(5) == ["a", "b", "liar"]
        step, record = job.durable()
        assert step == record["committed_step"] == 5, record  # the steps, not the report's
        heals = job.core.snapshot()["history"]["heals"]
        assert [h["replica_id"] for h in heals] == ["liar"]  # nobody else's row changed

    run(body)


def test_shrink_only_holds_joiners_back_only_while_it_waits(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(2)
        liar = job.core.request(QuorumMember("liar", step=3, shrink_only=True))
        joiner = job.core.request(QuorumMember("joiner", step=3))
        job.core.withdraw("liar", liar)
        job.core.withdraw("joiner", joiner)
        assert job.core.state.shrink_pending == 0  # nothing of it stays
        job.core.request(QuorumMember("joiner", step=3))
        assert job.honest_round(3) == ["a", "b", "joiner"]

    run(body)


def test_the_history_forgets_a_heal_to_a_claimed_step(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(3)
        ghost = job.core.request(QuorumMember("ghost", step=CLAIM))
        job.honest_round(4)  # both told to heal to the claim
        job.core.withdraw("ghost", ghost)
        job.honest_round(5)
        job.train(1)
        rows = {r["replica_id"]: r for r in job.core.snapshot()["health"]}
        assert rows["a"]["status"] == rows["b"]["status"] == "ok", rows
        assert rows["a"]["lag"] == 0  # an unproven claim makes nobody look behind
        assert job.core.history._healing == {}  # no heal to 2**62 left pending

    run(body)


def test_a_leaving_ping_cannot_claim_more_than_its_last_round() -> None:
    from lighthouse.types import Quorum

    lease = QuorumLease()
    members = (QuorumMember("a", step=7), QuorumMember("b", step=7))
    lease.grant(1, Quorum(1, "ep", members), now=0.0)
    lease.progress("a", 8, now=1.0)
    recall, _ = lease.recall_for_leave("ep", "a", committed_through=CLAIM)
    assert recall is not None and recall.valid_below_step == 9, recall  # its round 8 + 1


def test_state_file_quorum_size_counts_only_members_that_report(tmp_path: Path) -> None:
    async def body() -> None:
        job = Job(tmp_path)
        job.train(2)
        ghosts = [job.core.request(QuorumMember(f"g{i}", step=3)) for i in range(5)]
        assert len(job.honest_round(3)) == 7  # five strangers in one quorum
        for i, g in enumerate(ghosts):
            job.core.withdraw(f"g{i}", g)
            job.core.state.forget(f"g{i}")  # gone
        job.train(2)
        job.assert_honest(5)  # quorum_members == 2, never 7

    run(body)
