"""JobStateFile: atomic, throttled writes of the job's committed step (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert (old.load(), old.quorum_members) == (4, 0)
