"""The job's committed step outlives the lighthouse: a restarted lighthouse with the
same state file refuses a quorum that would restart the job below it (real gRPC)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from lighthouse import LighthouseClient, QuorumTimeoutError
from lighthouse.coordinator.cli import state_file_for
from tests.integration.lh_fixtures import lighthouse

pytestmark = pytest.mark.timeout(60)


def _ask(addr: str, rid: str, step: int, timeout_s: float) -> list[str]:
    client = LighthouseClient(addr, connect_timeout=timedelta(seconds=5))
    try:
        return client.quorum(rid, timeout=timedelta(seconds=timeout_s), step=step).replica_ids
    finally:
        client.close()


def test_restarted_lighthouse_refuses_a_reset_below_the_recorded_step(tmp_path: Path) -> None:
    state = tmp_path / "job.json"
    with lighthouse(min_replicas=1, join_timeout_ms=0, state_file=state) as lh:
        assert _ask(lh.address(), "a", 7, 5) == ["a"]
    assert json.loads(state.read_text())["committed_step"] == 7  # flushed at shutdown

    with lighthouse(min_replicas=1, join_timeout_ms=0, state_file=state) as lh:
        assert lh.status()["committed_step"] == 7
        with pytest.raises(QuorumTimeoutError) as info:
            _ask(lh.address(), "fresh", 0, 3)
        # the lighthouse's reason reaches the caller, not a bare deadline
        message = str(info.value)
        assert "committed step 7" in message and "--allow-step-reset" in message, message
        assert _ask(lh.address(), "loaded", 7, 5) == ["loaded"]  # a checkpoint at step 7

    with lighthouse(
        min_replicas=1, join_timeout_ms=0, state_file=state, allow_step_reset=True
    ) as lh:
        assert _ask(lh.address(), "fresh", 0, 5) == ["fresh"]
    assert json.loads(state.read_text())["committed_step"] == 0  # the reset is the new history


def test_a_restarted_lighthouse_waits_for_a_majority_of_the_quorum_before_shutdown(
    tmp_path: Path,
) -> None:
    """The quorum's size survives a clean shutdown as well as the step: the first
    replica to reconnect must not get a quorum alone (it would commit a step
    the others, still finishing the old quorum's step, never see)."""
    state = tmp_path / "job.json"
    with (
        lighthouse(min_replicas=3, join_timeout_ms=5000, state_file=state) as lh,
        ThreadPoolExecutor(3) as pool,
    ):
        asks = [pool.submit(_ask, lh.address(), rid, 4, 10) for rid in ("a", "b", "c")]
        assert all(sorted(f.result()) == ["a", "b", "c"] for f in asks)
    record = json.loads(state.read_text())
    assert (record["committed_step"], record["quorum_members"]) == (4, 3), record

    with (
        lighthouse(
            min_replicas=1, join_timeout_ms=0, heartbeat_timeout_ms=20_000, state_file=state
        ) as lh,
        ThreadPoolExecutor(2) as pool,
    ):
        with pytest.raises(QuorumTimeoutError, match="the restart had 3 members"):
            _ask(lh.address(), "a", 4, 1)
        both = [pool.submit(_ask, lh.address(), rid, 4, 10) for rid in ("a", "b")]
        assert all(sorted(f.result()) == ["a", "b"] for f in both)


def test_without_a_state_file_a_restart_forgets_and_says_so() -> None:
    with lighthouse(min_replicas=1, join_timeout_ms=0) as lh:
        _ask(lh.address(), "a", 7, 5)
        assert lh.status()["job_state_file"] is None
    with lighthouse(min_replicas=1, join_timeout_ms=0) as lh:
        assert lh.status()["committed_step"] == 0
        assert _ask(lh.address(), "fresh", 0, 5) == ["fresh"]


def test_a_state_file_that_is_not_ours_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text('{"step": 3}')
    with (
        pytest.raises(ValueError, match=r"other\.json.*committed_step"),
        lighthouse(state_file=bad),
    ):
        pass
    bad.write_text('{"committed_step": -1}')
    with (
        pytest.raises(ValueError, match="committed_step must be an int >= 0, got -1"),
        lighthouse(state_file=bad),
    ):
        pass


def test_command_line_state_file_default_is_per_port() -> None:
    assert state_file_for("auto", "[::]:29510") == "torchft-pg-lighthouse-29510.state.json"
    assert state_file_for("auto", "127.0.0.1:0") is None
    assert state_file_for("none", "[::]:29510") is None
    assert state_file_for("/var/lib/lh.json", "[::]:1") == "/var/lib/lh.json"
