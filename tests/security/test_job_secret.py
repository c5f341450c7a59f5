"""A job with a secret is closed to strangers: every call without it is refused and changes nothing.

The job (a lighthouse and manager servers, or a checkpoint sender) runs in this
process; each attacker runs in a process of its own.
"""

from __future__ import annotations

import os
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from lighthouse import LighthouseServer, ManagerClient, ManagerServer
from lighthouse.auth import resolve_job_secret
from lighthouse.errors import FaultToleranceError
from tests.integration.lh_fixtures import lighthouse, quorum_request
from tests.integration.test_lh_manager import in_threads
from tests.multiproc import RankContext, run_ranks
from tests.security.healing_job import replica_with_env
from torchft_pg.checkpointing import HTTPTransport

pytestmark = pytest.mark.timeout(120)
SECRET = "s3cret-for-this-job-only"
T = timedelta(seconds=10)


def _stranger_lighthouse_quorum(ctx: RankContext) -> str:
    from lighthouse import LighthouseClient

    addr, secret = ctx.args
    client = LighthouseClient(addr, timedelta(seconds=2), job_secret=secret)
    try:
        client.quorum("intruder", timedelta(seconds=2), step=1000)
    except FaultToleranceError as e:
        return str(e)
    return "accepted"


def _stranger_manager_calls(ctx: RankContext) -> list[str]:
    addr, secret = ctx.args
    client = ManagerClient(addr, timedelta(seconds=2), job_secret=secret)
    out = []
    for call in (
        lambda: client.should_commit(0, 7, True, timedelta(seconds=2)),  # a vote ahead
        lambda: client.kill("by a stranger", timedelta(seconds=2)),
        lambda: client.checkpoint_metadata(0, timedelta(seconds=2)),
    ):
        try:
            call()
            out.append("accepted")
        except FaultToleranceError as e:
            out.append(str(e))
    return out


def test_the_lighthouse_refuses_a_quorum_request_without_the_secret() -> None:
    with lighthouse(min_replicas=1, job_secret=SECRET) as lh:
        for secret in (None, "a-wrong-secret-of-some-length"):
            [why] = run_ranks(_stranger_lighthouse_quorum, 1, lh.address(), secret)
            assert "UNAUTHENTICATED" in why and "job secret" in why, why
            assert SECRET not in why
        assert "intruder" not in str(lh.status())  # it never became known
        # The job itself still forms quorums with the secret.
        with ManagerServer(
            "rep0", lh.address(), bind="127.0.0.1:0", world_size=1, job_secret=SECRET
        ) as ms:
            client = ManagerClient(ms.address(), job_secret=SECRET)
            result = client.quorum(quorum_request(0, 1))
            assert result.replica_ids == ["rep0"]
            assert client.should_commit(0, 1, True, T) is True


def test_a_manager_server_refuses_votes_kills_and_metadata_requests_without_the_secret() -> None:
    with (
        lighthouse(min_replicas=1, job_secret=SECRET) as lh,
        ManagerServer(
            "rep0", lh.address(), bind="127.0.0.1:0", world_size=2, job_secret=SECRET
        ) as ms,
    ):
        member = ManagerClient(ms.address(), job_secret=SECRET)
        in_threads([partial(member.quorum, quorum_request(g, 1)) for g in range(2)])
        refusals = run_ranks(_stranger_manager_calls, 1, ms.address(), None)[0]
        assert all("UNAUTHENTICATED" in r for r in refusals), refusals
        # Nothing changed: the group's real votes for step 1 decide as usual
        # (a stranger's vote for a later step would have abandoned this one).
        votes = in_threads([partial(member.should_commit, g, 1, True, T) for g in range(2)])
        assert votes == [True, True]


def test_kill_is_refused_unless_enabled_even_with_the_secret() -> None:
    with (
        lighthouse(min_replicas=1, job_secret=SECRET) as lh,
        ManagerServer(
            "rep0", lh.address(), bind="127.0.0.1:0", world_size=1, job_secret=SECRET
        ) as ms,
    ):
        refusals = run_ranks(_stranger_manager_calls, 1, ms.address(), SECRET)[0]
        assert "PERMISSION_DENIED" in refusals[1] and "allow_kill" in refusals[1], refusals
        # This process is still alive (the default Kill would have exited it).
        assert ManagerClient(ms.address(), job_secret=SECRET).quorum(quorum_request(0, 1))


def _fetch(ctx: RankContext) -> str:
    metadata, secret = ctx.args
    receiver: HTTPTransport[dict[str, Any]] = HTTPTransport(
        timedelta(seconds=5), bind_host="127.0.0.1", job_secret=secret
    )
    try:
        state = receiver.recv_checkpoint(0, metadata, 3, timedelta(seconds=5))
        return f"got {state['w'].tolist()}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        receiver.shutdown()


def test_a_checkpoint_is_served_only_to_requests_with_the_secret() -> None:
    sender: HTTPTransport[dict[str, Any]] = HTTPTransport(
        timedelta(seconds=5), bind_host="127.0.0.1", job_secret=SECRET
    )
    try:
        sender.send_checkpoint([1], 3, {"w": torch.arange(3.0)}, timedelta(seconds=5))
        [theft] = run_ranks(_fetch, 1, sender.metadata(), None)
        assert "401" in theft and "job secret" in theft and "got" not in theft, theft
        [heal] = run_ranks(_fetch, 1, sender.metadata(), SECRET)
        assert heal == "got [0.0, 1.0, 2.0]"
    finally:
        sender.shutdown()


def test_the_secret_comes_from_the_argument_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHFT_JOB_SECRET", raising=False)
    monkeypatch.delenv("TORCHFT_JOB_SECRET_FILE", raising=False)
    assert resolve_job_secret() is None
    assert resolve_job_secret(SECRET) == SECRET
    path = tmp_path / "secret"
    path.write_text(f"  {SECRET}-from-file\n")
    monkeypatch.setenv("TORCHFT_JOB_SECRET_FILE", str(path))
    assert resolve_job_secret() == f"{SECRET}-from-file"
    monkeypatch.setenv("TORCHFT_JOB_SECRET", f"{SECRET}-from-env")
    assert resolve_job_secret() == f"{SECRET}-from-env"  # the variable wins over the file
    with pytest.raises(ValueError, match="at least 16 characters, got 5"):
        resolve_job_secret("short")
    assert os.environ["TORCHFT_JOB_SECRET"].endswith("-from-env")


def test_a_job_whose_processes_share_the_secret_trains_and_heals() -> None:
    with LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, job_secret=SECRET
    ) as lh:
        r0, r1 = run_ranks(
            replica_with_env, 2, lh.address(), {"TORCHFT_JOB_SECRET": SECRET}, None, timeout=120
        )
    assert r0["step"] == r1["step"] >= 6
    assert r0["w"] == r1["w"]  # replica 1 healed over the secret-checked HTTP server


def test_a_manager_server_with_the_wrong_secret_fails_to_start_saying_why() -> None:
    with (
        lighthouse(min_replicas=1, job_secret=SECRET) as lh,
        pytest.raises(FaultToleranceError, match=r"UNAUTHENTICATED.*job secret"),
    ):
        ManagerServer(
            "rep0",
            lh.address(),
            bind="127.0.0.1:0",
            world_size=1,
            job_secret="not-the-secret-of-this-job",
            connect_timeout=timedelta(seconds=2),
        ).shutdown()
