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
