"""JobStateFile: atomic, throttled writes of the job's committed step (no sockets)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from lighthouse.coordinator.job_state import JobStateFile


def test_missing_file_is_step_zero_and_writes_are_throttled(tmp_path: Path) -> None:
    f = JobStateFile(tmp_path / "sub" / "s.json", min_interval_s=1.0)
    assert f.load() == 0
    assert f.record(5, now=10.0)  # first write goes out (and makes the directory)
    assert not f.record(6, now=10.5)  # within the interval: held back
    assert json.loads(f.path.read_text())["committed_step"] == 5
    assert f.flush(now=11.0, force=False)  # the tick after the interval writes it
    assert json.loads(f.path.read_text())["committed_step"] == 6
    assert not f.record(6, now=20.0)  # unchanged: nothing to write
    assert JobStateFile(f.path).load() == 6
    assert [p.name for p in f.path.parent.iterdir()] == ["s.json"]  # no temporary left


def test_forced_flush_ignores_the_throttle(tmp_path: Path) -> None:
    f = JobStateFile(tmp_path / "s.json", min_interval_s=60.0)
    f.load()
    f.record(1, now=0.0)
    f.record(9, now=0.1)
    assert f.flush()
    assert JobStateFile(f.path).load() == 9


def test_the_last_quorum_size_is_kept_and_older_records_read_as_zero(tmp_path: Path) -> None:
    f = JobStateFile(tmp_path / "s.json", min_interval_s=0.0)
    f.load()
    assert f.record(7, now=0.0, quorum_members=3)
    assert not f.record(7, now=1.0, quorum_members=3)  # nothing changed
    assert f.record(7, now=2.0, quorum_members=2)  # a smaller quorum alone is news
    again = JobStateFile(f.path)
    assert (again.load(), again.quorum_members) == (7, 2)
    f.path.write_text(json.dumps({"committed_step": 4, "epoch": "e"}))
    old = JobStateFile(f.path)
    assert (old.load(), old.quorum_members, old.run_ended) == (4, 0, False)


def test_a_run_that_ended_is_recorded_and_read_back(tmp_path: Path) -> None:
    f = JobStateFile(tmp_path / "s.json", min_interval_s=0.0)
    f.load()
    assert f.record(9, now=0.0, quorum_members=2)
    assert f.record(9, now=1.0, quorum_members=0, run_ended=True)  # the end alone is news
    again = JobStateFile(f.path)
    assert (again.load(), again.quorum_members, again.run_ended) == (9, 0, True)


def test_a_failed_write_raises_nothing_is_reported_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "state"
    f = JobStateFile(directory / "s.json", min_interval_s=0.0)
    f.load()
    assert f.record(1, now=0.0) and f.error is None
    shutil.rmtree(directory)
    directory.write_text("not a directory")  # every write now fails
    caplog.set_level(logging.INFO, logger="lighthouse")
    assert not f.record(2, now=1.0)
    assert not f.record(3, now=2.0)
    assert not f.flush(now=3.0)  # the shutdown flush too: nothing raises
    error = f.error
    assert error is not None and error["failed_writes"] == 3, error
    assert error["error"].startswith(("FileExistsError", "NotADirectoryError")), error
    failures = [r for r in caplog.records if "cannot write the job state file" in r.message]
    assert len(failures) == 1 and failures[0].levelno == logging.ERROR  # once per episode
    assert "committed step (2) is kept in memory and quorums go on" in failures[0].message
    directory.unlink()  # the disk is fixed: the next write succeeds and says so
    assert f.record(4, now=4.0) and f.error is None
    assert JobStateFile(f.path).load() == 4
    assert "written again (committed step 4) after 3 failed write(s)" in caplog.text
    assert [p.name for p in directory.iterdir()] == ["s.json"]  # no temporary left


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "it is not JSON"),
        ("[7]", "expected a JSON object, got list"),
        ('{"step": 7}', "it is not a job-state record"),
        (
            '{"committed_step": 4611686018427387904}',
            "committed_step must be an int in [0, 9007199254740992], got 4611686018427387904",
        ),
        ('{"committed_step": -1}', "committed_step must be an int in [0, "),
        ('{"committed_step": 1.5}', "committed_step must be an int in [0, "),
        ('{"committed_step": true}', "committed_step must be an int in [0, "),
        (
            '{"committed_step": 5, "quorum_members": -2}',
            "quorum_members must be an int in [0, 1048576], got -2",
        ),
        (
            '{"committed_step": 5, "quorum_members": 99999999}',
            "quorum_members must be an int in [0, 1048576]",
        ),
        ('{"committed_step": 5, "quorum_members": "3"}', "quorum_members must be an int"),
        ('{"committed_step": 5, "epoch": 12}', "epoch must be a string"),
        ('{"committed_step": 5, "run_ended": "yes"}', "run_ended must be true or false"),
    ],
)
def test_a_corrupt_or_absurd_file_is_refused_with_what_is_wrong(
    tmp_path: Path, content: str, says: str
) -> None:
    """Obeying an absurd step would refuse every quorum for good; reading it as 0 would
    drop the protection silently: the operator is told, and decides."""
    f = JobStateFile(tmp_path / "s.json")
    f.path.write_text(content)
    with pytest.raises(ValueError) as info:
        f.load()
    message = str(info.value)
    assert str(f.path) in message and "is refused" in message and says in message, message
    assert "--state-file" in message
    assert f.path.read_text() == content  # left for the operator, untouched


def test_the_largest_plausible_step_and_quorum_are_read(tmp_path: Path) -> None:
    f = JobStateFile(tmp_path / "s.json")
    f.path.write_text(json.dumps({"committed_step": 2**53, "quorum_members": 2**20}))
    assert (f.load(), f.quorum_members) == (2**53, 2**20)
