"""The job's committed step outlives the lighthouse: a restarted lighthouse with the
same state file refuses a quorum that would restart the job below it (real gRPC)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from lighthouse import (
    LighthouseClient,
    LighthouseServer,
    ManagerClient,
    ManagerServer,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from lighthouse.coordinator.cli import state_file_for
from tests.integration.lh_fixtures import lighthouse, quorum_request

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
        assert _ask(lh.address(), "a", 6, 5) == ["a"]
        assert lh.status()["committed_step"] == 0  # a claim: nobody reported after it yet
        assert _ask(lh.address(), "a", 7, 5) == ["a"]  # a committed step 6: it holds 7
    assert json.loads(state.read_text())["committed_step"] == 7  # flushed at shutdown

    with lighthouse(min_replicas=1, join_timeout_ms=0, state_file=state) as lh:
        assert lh.status()["committed_step"] == 7
        with pytest.raises(QuorumTimeoutError) as info:
            _ask(lh.address(), "fresh", 0, 3)
        # the lighthouse's reason reaches the caller, not a bare deadline
        message = str(info.value)
        assert "committed step 7" in message and "--allow-step-reset" in message, message
        # once every live replica has had heartbeat_timeout (5 s) to show itself and all
        # that are live ask below step 7, no wait helps: the refusal comes at once
        started = time.monotonic()
        with pytest.raises(QuorumRejectedError, match="committed step 7"):
            _ask(lh.address(), "fresh", 0, 30)
        assert time.monotonic() - started < 25, "the final refusal waited for the deadline"
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
        for step in (3, 4):  # the second round reports that all three reached step 4
            asks = [pool.submit(_ask, lh.address(), rid, step, 10) for rid in ("a", "b", "c")]
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
        pytest.raises(
            ValueError, match=r"committed_step must be an int in \[0, 9007199254740992\], got -1"
        ),
        lighthouse(state_file=bad),
    ):
        pass


def test_command_line_state_file_default_is_per_port_and_job_in_the_users_state_dir(
    tmp_path: Path,
) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    assert state_file_for("auto", "[::]:29510", environ=env) == str(
        tmp_path / "torchft-pg" / "lighthouse-29510.state.json"
    )
    assert state_file_for("auto", "[::]:29510", "slurm/42 a", environ=env) == str(
        tmp_path / "torchft-pg" / "lighthouse-29510-slurm_42_a.state.json"
    )
    home = Path.home() / ".local" / "state" / "torchft-pg" / "lighthouse-1.state.json"
    assert state_file_for("auto", "[::]:1", environ={}) == str(home)
    assert state_file_for("auto", "127.0.0.1:0", environ=env) is None
    assert state_file_for("none", "[::]:29510") is None
    assert state_file_for("/var/lib/lh.json", "[::]:1") == "/var/lib/lh.json"


@contextmanager
def _groups(lh: LighthouseServer, names: Sequence[str]) -> Iterator[list[ManagerServer]]:
    """One manager server per replica group (world size 1), each on its own
    liveness stream; shut down (a clean leave) on exit unless the test did first."""
    with ExitStack() as stack:
        servers = []
        for name in names:
            ms = ManagerServer(name, lh.address(), bind="127.0.0.1:0", world_size=1)
            stack.callback(ms.shutdown)
            servers.append(ms)
        yield servers


def _steps(servers: Sequence[ManagerServer], step: int) -> list[list[str]]:
    """Every server asks for a quorum at ``step`` at once; each one's members."""
    clients = [ManagerClient(ms.address()) for ms in servers]
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            asks = [pool.submit(c.quorum, quorum_request(0, step)) for c in clients]
            return [sorted(f.result().replica_ids) for f in asks]
    finally:
        for c in clients:
            c.close()


def _status_when(lh: LighthouseServer, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``/status`` once ``pred`` holds of it (asked every 20 ms, for at most 10 s)."""
    deadline = time.monotonic() + 10
    while not pred(status := lh.status()):
        assert time.monotonic() < deadline, f"status stayed {status!r:.600}"
        threading.Event().wait(0.02)
    return status


def test_a_run_that_ended_cleanly_lets_a_second_run_start_from_step_0(tmp_path: Path) -> None:
    """Every group shut down cleanly at the end of training: the run is over, and
    the same command run again (fresh replicas at step 0) is a new run, with this
    lighthouse or a restarted one. A restart from an older checkpoint is still
    refused, and the new run's steps are the job's history from then on."""
    state = tmp_path / "job.json"
    config = dict(min_replicas=2, join_timeout_ms=30_000, quorum_lease=False, state_file=state)
    with lighthouse(**config) as lh:
        with _groups(lh, ["a", "b"]) as groups:
            for step in (3, 4):
                assert _steps(groups, step) == [["a", "b"]] * 2
            groups[0].shutdown()
            assert lh.status()["run_ended"] is False  # b is still there
        status = _status_when(lh, lambda s: s["run_ended"])
        assert status["committed_step"] == 4
        assert json.loads(state.read_text())["run_ended"] is True  # written at once

        with _groups(lh, ["a2", "b2"]) as groups:  # the second run, same lighthouse
            assert _steps(groups, 0) == [["a2", "b2"]] * 2
            assert lh.status()["run_ended"] is False
            assert _steps(groups, 1) == [["a2", "b2"]] * 2
        status = _status_when(lh, lambda s: s["run_ended"])
        assert status["committed_step"] == 1  # the new run's history replaced the old

    with lighthouse(**config) as lh:  # restarted: the file says the run ended
        assert (lh.status()["committed_step"], lh.status()["run_ended"]) == (1, True)
        with _groups(lh, ["c", "d"]) as groups:
            assert _steps(groups, 0) == [["c", "d"]] * 2
        ended = [e for e in lh.status()["history"]["timeline"] if e["kind"] == "run_ended"]
        assert [e["step"] for e in ended] == [0], ended  # the dashboard's timeline says it


def test_a_restart_below_an_ended_run_from_a_checkpoint_is_still_refused(tmp_path: Path) -> None:
    state = tmp_path / "job.json"
    with lighthouse(
        min_replicas=1,
        join_timeout_ms=0,
        quorum_lease=False,
        state_file=state,
        heartbeat_timeout_ms=2000,
    ) as lh:
        with _groups(lh, ["a"]) as (a,):
            for step in (6, 7):
                assert _steps([a], step) == [["a"]]
        _status_when(lh, lambda s: s["run_ended"] and s["committed_step"] == 7)
        # final (nobody else is live): refused at once, not at the 30 s deadline
        with pytest.raises(QuorumRejectedError) as info:
            _ask(lh.address(), "old", 5, 30)
        message = str(info.value)
        assert "committed step 7" in message and "ended cleanly" in message, message


def test_a_run_whose_replicas_died_is_not_ended_and_step_0_is_refused(tmp_path: Path) -> None:
    """A whole job that crashed (here: one group killed, the other cut off
    without a leave) did not end: fresh replicas at step 0 would silently
    restart it from initial weights, so they are refused."""
    state = tmp_path / "job.json"
    with lighthouse(
        min_replicas=1,
        join_timeout_ms=5000,
        quorum_lease=False,
        state_file=state,
        heartbeat_timeout_ms=2000,
    ) as lh:
        with _groups(lh, ["a", "b"]) as groups:
            for step in (3, 4):
                assert _steps(groups, step) == [["a", "b"]] * 2
            groups[0].shutdown(leave=False)  # a dies
            _status_when(lh, lambda s: len(s["recent_deaths"]) == 1)
            groups[1].shutdown()  # b leaves cleanly, but a member of its quorum died
        _status_when(lh, lambda s: not s["live"])
        assert lh.status()["run_ended"] is False
        # through a manager server, as a job asks: at once, not at the 10 s deadline
        with (
            _groups(lh, ["fresh"]) as fresh,
            pytest.raises(QuorumRejectedError, match="committed step 4"),
        ):
            _steps(fresh, 0)
    assert json.loads(state.read_text())["run_ended"] is False


def _state_error_when(lh: LighthouseServer, pred: Callable[[Any], bool]) -> Any:
    """``/status``'s ``job_state_error`` once ``pred`` holds of it (asked every
    20 ms, for at most 5 s: the lighthouse's tick writes every 100 ms)."""
    deadline = time.monotonic() + 5
    while not pred(error := lh.status()["job_state_error"]):
        assert time.monotonic() < deadline, f"job_state_error stayed {error!r}"
        threading.Event().wait(0.02)
    return error


def test_a_state_file_that_cannot_be_written_fails_no_quorum_and_shows_on_status(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "state"
    state = directory / "job.json"
    with lighthouse(min_replicas=1, join_timeout_ms=0, state_file=state) as lh:
        assert _ask(lh.address(), "a", 0, 5) == ["a"]
        assert _ask(lh.address(), "a", 1, 5) == ["a"]  # committed step 1: written
        _state_error_when(lh, lambda e: e is None)
        assert state.exists()
        assert lh.status()["job_state_error"] is None
        shutil.rmtree(directory)
        directory.write_text("not a directory")  # every write fails from here on
        for step in range(2, 6):  # each quorum records a higher step: none fails
            assert _ask(lh.address(), "a", step, 5) == ["a"]
        # writes are throttled (the tick writes what was held back): wait for one
        error = _state_error_when(lh, lambda e: e is not None)
        assert error["failed_writes"] >= 1 and "File exists" in error["error"], error
        assert lh.status()["committed_step"] == 5  # kept in memory
        directory.unlink()
        assert _ask(lh.address(), "a", 6, 5) == ["a"]
        _state_error_when(lh, lambda e: e is None)  # written again
    assert json.loads(state.read_text())["committed_step"] == 6
