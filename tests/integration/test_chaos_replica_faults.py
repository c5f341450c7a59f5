"""`ReplicaFaults` in a real process: a FREEZE stops it and its helper resumes it, a
KILL_REPLICA SIGKILLs it, and the process restarted on the same record fires neither again.

The rank under test is a child process stepping a loop the way a training
loop does (`fire_due`, an allreduce on the wrapped group, `after_forward`),
printing each step it finishes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_BOUND_S = 120.0  # a child that never resumes from its freeze hangs until then
FREEZE_S = 1.0  # the helper's SIGCONT, seconds after the freeze

CHILD = """
import sys
from datetime import timedelta

import torch

from torchft_pg.chaos import Fault, FaultPlan, ReplicaFaults
from torchft_pg.process_group import ProcessGroupDummy

plan = FaultPlan({(0, 1): Fault.FREEZE, (0, 2): Fault.KILL_REPLICA})
faults = ReplicaFaults(plan, 0, freeze_s=float(sys.argv[1]), record=sys.argv[2])
pg = faults.wrap_process_group(ProcessGroupDummy())
for step in range(4):
    faults.fire_due(step)
    pg.allreduce([torch.ones(1)]).wait(timedelta(seconds=10))  # a FREEZE lands in here
    faults.after_forward()  # a KILL_REPLICA lands here
    print(f"step {step}", flush=True)
"""


def _run(record: Path) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(FREEZE_S), str(record)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the child and its resumer, stopped together below
    )
    try:
        out, err = proc.communicate(timeout=RUN_BOUND_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return proc.returncode, out, err


def test_a_frozen_rank_resumes_a_killed_one_dies_and_a_restart_fires_neither(
    tmp_path: Path,
) -> None:
    record = tmp_path / "faults.0.0"
    code, out, err = _run(record)
    assert code == -signal.SIGKILL, err
    assert out.splitlines() == ["step 0", "step 1"], err  # resumed after the freeze at step 1
    assert "freezes now, in the allreduce_before phase" in err
    assert "dies now, in the forward phase" in err
    code, out, err = _run(record)  # the same rank restarted: its faults already fired
    assert code == 0, err
    assert out.splitlines() == [f"step {step}" for step in range(4)]
