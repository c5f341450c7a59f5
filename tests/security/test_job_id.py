"""Two jobs pointed at one lighthouse never merge: a lighthouse with a job id refuses others."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lighthouse import LighthouseClient, ManagerClient, ManagerServer, QuorumRejectedError
from lighthouse.errors import FaultToleranceError
from tests.integration.lh_fixtures import lighthouse, quorum_request

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=5)


def test_a_lighthouse_with_a_job_id_serves_only_that_jobs_replicas() -> None:
    with lighthouse(min_replicas=1, job_id="job-a") as lh:
        with ManagerServer(
            "rep0", lh.address(), bind="127.0.0.1:0", world_size=1, job_id="job-a"
        ) as ms:
            result = ManagerClient(ms.address()).quorum(quorum_request(0, 1))
            assert result.replica_ids == ["rep0"]
        for other in ("job-b", None):
            client = LighthouseClient(lh.address(), T, job_id=other)
            with pytest.raises(QuorumRejectedError, match="serves job 'job-a', the call is for"):
                client.quorum("stranger", T, step=1)
        assert "stranger" not in str(lh.status())


def test_a_replica_of_another_job_fails_to_start_naming_both_jobs() -> None:
    with (
        lighthouse(min_replicas=1, job_id="job-a") as lh,
        pytest.raises(FaultToleranceError, match="serves job 'job-a', the call is for job 'job-b'"),
    ):
        ManagerServer(
            "rep0",
            lh.address(),
            bind="127.0.0.1:0",
            world_size=1,
            job_id="job-b",
            connect_timeout=timedelta(seconds=2),
        ).shutdown()
