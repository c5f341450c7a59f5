"""A process whose replica groups healed exits 0 (see heal_then_exit.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_a_process_exits_cleanly_after_two_in_process_groups_healed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.heal_then_exit"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert "a done at step 12" in proc.stdout and "b done at step 12" in proc.stdout, (
        proc.stdout + proc.stderr[-3000:]
    )
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
