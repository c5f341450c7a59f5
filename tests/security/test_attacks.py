"""Attacks on a training job, each from a process of its own: refused, and nothing changes.

The job (a lighthouse with a job secret and two manager servers whose ranks
ask for quorums and vote every step) runs in this process; each attack runs
``python -m tests.security.attacker`` once. Every test checks the refusal and
that the job did not notice: the victim's pending request or vote survives,
quorums keep forming with both replicas, every step commits, and no survivor
hears of a failure.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from lighthouse import (
    FailureNotice,
    LighthouseClient,
    LighthouseServer,
    ManagerClient,
    ManagerServer,
    QuorumResult,
)
from lighthouse.coordinator.server import MAX_STREAMS_PER_REPLICA
from tests.integration.lh_fixtures import ROOT, lighthouse, quorum_request
from tests.integration.test_lh_manager import in_threads

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cret-for-this-job-only"
T = timedelta(seconds=10)


def attack(*args: str) -> list[str]:
    """Run one attack in a fresh process; its calls' outcomes ("accepted" or the refusal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFT_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.security.attacker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    outcomes: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])["outcomes"]
    return outcomes


class Job:
    """Two replica groups of ``world_size`` ranks each, driven one step at a time."""

    def __init__(self, lh: LighthouseServer, servers: list[ManagerServer]) -> None:
        self.lh = lh
        self.servers = servers
        self.world_size = servers[0].world_size
        self.clients = [ManagerClient(ms.address(), job_secret=SECRET) for ms in servers]
        self.notices: list[FailureNotice] = []
        self.subs = [c.subscribe_failures(self.notices.append) for c in self.clients]
        for sub in self.subs:
            assert sub.wait_ready(T)

    @property
    def ids(self) -> list[str]:
        return [ms.replica_id for ms in self.servers]

    def quorum(self, step: int) -> list[QuorumResult]:
        """Every rank of both groups asks for the quorum of ``step``."""
        results = in_threads(
            [
                partial(c.quorum, quorum_request(g, step))
                for c in self.clients
                for g in range(self.world_size)
            ]
        )
        for r in results:
            assert isinstance(r, QuorumResult), r
            assert sorted(r.replica_ids) == sorted(self.ids)  # both replicas, no one else
        return results

    def vote(self, step: int) -> None:
        """Every rank votes yes for ``step``: the step commits in both groups."""
        votes = in_threads(
            [
                partial(c.should_commit, g, step, True, T)
                for c in self.clients
                for g in range(self.world_size)
            ]
        )
        assert votes == [True] * len(votes), votes

    def train(self, start: int, stop: int) -> None:
        """Steps ``start`` to ``stop - 1``, each a quorum and a committed vote."""
        for step in range(start, stop):
            self.quorum(step)
            self.vote(step)

    def wait_pending(self, replica_id: str) -> None:
        """Until ``replica_id``'s quorum request waits at the lighthouse."""
        deadline = time.monotonic() + 10
        while replica_id not in self.lh.status()["next_quorum"]["pending"]:
            assert time.monotonic() < deadline, self.lh.status()["next_quorum"]
            time.sleep(0.02)

    def assert_undisturbed(self) -> None:
        """No survivor heard of a failure and the lighthouse saw no death."""
        status = self.lh.status()
        assert self.notices == [] and status["recent_deaths"] == [], status["recent_deaths"]
        live = {r["replica_id"]: r["liveness_streams"] for r in status["live"]}
        assert live == dict.fromkeys(self.ids, 1), live  # no stranger's stream counts

    def close(self) -> None:
        for sub in self.subs:
            sub.cancel()
        for c in self.clients:
            c.close()


@contextmanager
def training_job(world_size: int = 1, **lighthouse_kw: Any) -> Iterator[Job]:
    """A lighthouse (job secret, no leases: every step asks it; ``lighthouse_kw``
    sets more) and two replica groups."""
    with (
        lighthouse(min_replicas=2, job_secret=SECRET, quorum_lease=False, **lighthouse_kw) as lh,
        ExitStack() as stack,
    ):
        servers = []
        for i in range(2):
            ms = ManagerServer(
                f"rep{i}:{uuid.uuid4().hex[:8]}",  # one incarnation's id, as Manager makes it
                lh.address(),
                bind="127.0.0.1:0",
                store_addr=f"127.0.0.1:{4000 + i}",
                world_size=world_size,
                job_secret=SECRET,
            )
            stack.callback(ms.shutdown)
            servers.append(ms)
        job = Job(lh, servers)
        stack.callback(job.close)
        yield job


def test_id_reuse_a_stranger_asking_under_a_live_members_id_is_refused() -> None:
    with training_job() as job, concurrent.futures.ThreadPoolExecutor(1) as pool:
        job.train(0, 3)
        victim = job.ids[0]
        mine = pool.submit(job.clients[0].quorum, quorum_request(0, 3))
        job.wait_pending(victim)  # rep0 waits for rep1: its request is pending
        # The stranger knows the job secret (a stale or buggy process of the job)
        # but not rep0's incarnation token; it asks with one of its own, then none.
        outcomes = attack(
            "quorum", "--addr", job.lh.address(), "--replica-id", victim,
            "--secret", SECRET, "--step", "3",
        )  # fmt: skip
        assert len(outcomes) == 2, outcomes
        for o in outcomes:
            assert "PERMISSION_DENIED" in o and victim in o and "another incarnation" in o, o
        # rep0's request was neither replaced nor failed: it still waits, and is answered
        # with rep1's in one quorum.
        assert victim in job.lh.status()["next_quorum"]["pending"]
        assert not mine.done()
        theirs = job.clients[1].quorum(quorum_request(0, 3))
        ours = mine.result(timeout=10)
        assert ours.quorum_id == theirs.quorum_id
        assert sorted(ours.replica_ids) == sorted(job.ids)
        job.vote(3)
        job.train(4, 6)
        job.assert_undisturbed()


def test_a_spoofed_leave_or_liveness_stream_under_a_members_id_is_refused() -> None:
    with training_job() as job:
        job.train(0, 2)
        victim = job.ids[0]
        outcomes = attack(
            "liveness", "--addr", job.lh.address(), "--replica-id", victim, "--secret", SECRET
        )
        # a stream with no token, one with another token, a token-less heartbeat
        assert len(outcomes) == 3, outcomes
        for o in outcomes:
            assert "PERMISSION_DENIED" in o and victim in o, o
        job.assert_undisturbed()  # rep0 still has only its own stream
        job.train(2, 5)
        job.assert_undisturbed()


def test_a_ghost_ahead_without_the_job_secret_is_refused_and_quorums_keep_forming() -> None:
    with training_job() as job:
        job.train(0, 2)
        committed = job.lh.status()["committed_step"]
        for secret in ([], ["--secret", "not-the-secret-of-this-job"]):
            outcomes = attack(
                "ghost", "--addr", job.lh.address(), "--replica-id", "ghost:0",
                "--step", str(10**9), *secret,
            )  # fmt: skip
            assert len(outcomes) == 1 and "UNAUTHENTICATED" in outcomes[0], outcomes
        status = job.lh.status()
        assert status["committed_step"] == committed  # not raised to the ghost's step
        assert "ghost" not in json.dumps(status)  # it never became known
        job.train(2, 5)
        assert job.lh.status()["committed_step"] == 4
        job.assert_undisturbed()


def test_a_vote_for_a_future_step_is_refused_and_the_group_keeps_committing() -> None:
    with training_job(world_size=2) as job, concurrent.futures.ThreadPoolExecutor(1) as pool:
        job.train(0, 2)
        job.quorum(2)
        rank0 = pool.submit(job.clients[0].should_commit, 0, 2, True, T)  # waits for rank 1
        # A stranger with the secret votes as group rank 1 for step 4: had it counted,
        # the open vote for step 2 would be abandoned (rank 0's wait failed).
        [outcome] = attack(
            "vote", "--addr", job.servers[0].address(), "--secret", SECRET, "--step", "4"
        )
        assert "QuorumRejectedError" in outcome and "vote ahead" in outcome, outcome
        assert not rank0.done()
        rest = in_threads(
            [
                partial(job.clients[0].should_commit, 1, 2, True, T),
                partial(job.clients[1].should_commit, 0, 2, True, T),
                partial(job.clients[1].should_commit, 1, 2, True, T),
            ]
        )
        assert rest == [True, True, True] and rank0.result(timeout=10) is True
        job.train(3, 5)
        job.assert_undisturbed()


def test_a_replica_far_ahead_of_the_committed_step_is_explained_in_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="lighthouse")
    with lighthouse(
        min_replicas=1, join_timeout_ms=0, heartbeat_timeout_ms=200, job_secret=SECRET
    ) as lh:
        client = LighthouseClient(lh.address(), job_secret=SECRET)
        client.quorum("steady", T, step=4)
        client.quorum("steady", T, step=5)  # it committed step 4: the job is at 5
        for _ in range(3):  # the ghost retries: one line, not three
            client.quorum("far-ahead", T, step=1000)
        client.quorum("steady", T, step=1001)  # one step above: not worth a line
    lines = [r.getMessage() for r in caplog.records if "far above" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "far-ahead" in lines[0] and "1000" in lines[0] and "committed step 5" in lines[0]


def test_a_flood_of_made_up_ids_is_refused_past_the_limit_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with training_job(max_tracked_replicas=6) as job, caplog.at_level(logging.WARNING):
        job.train(0, 2)
        outcomes = attack(
            "flood", "--addr", job.lh.address(), "--replica-id", "made-up-",
            "--secret", SECRET, "--count", "10",
        )  # fmt: skip
        assert outcomes[:4] == ["accepted"] * 4, outcomes  # the two members + 4 = 6
        for o in outcomes[4:]:
            assert "RESOURCE_EXHAUSTED" in o and "at most 6 replica ids" in o, o
        job.train(2, 4)  # the members, already tracked, go on
        assert job.notices == []
        said = [r for r in caplog.records if "refusing new replica ids" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]  # one line, not one per call


def test_liveness_streams_past_the_limit_under_one_id_are_refused() -> None:
    with training_job() as job:
        outcomes = attack(
            "streams", "--addr", job.lh.address(), "--replica-id", "extra:0123abcd",
            "--secret", SECRET, "--count", str(MAX_STREAMS_PER_REPLICA + 2),
        )  # fmt: skip
        refused = [o for o in outcomes if o != "accepted"]
        assert outcomes.count("accepted") == MAX_STREAMS_PER_REPLICA, outcomes
        for o in refused:
            assert "RESOURCE_EXHAUSTED" in o and "streams are already open" in o, o
        job.train(0, 2)
        assert job.notices == []
