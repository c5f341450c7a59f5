"""`make demo` (examples/demo.py) run for real, short: a lighthouse and three replica
groups on this machine, one SIGKILLed and healed.

Everything the demo starts runs on this machine, so every server listens on loopback
and no server warns that it listens beyond it (it used to: eight warnings, one per
manager and checkpoint server, each saying it listened on 0.0.0.0 or :: with no job
secret). That holds even when the shell exports another bind: here 0.0.0.0. The
demo runs in its own session, stopped by that session's id whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_S = 180.0  # 8 steps take ~6 s on an idle 2-core machine
# What a server says when it listens beyond loopback without a job secret
# (lighthouse.auth.warn_if_exposed), or refuses to (lighthouse.exposure.check_bind).
EXPOSED = re.compile(r"listens on (0\.0\.0\.0|::|\[::\]|\*)|no job secret")


def test_the_demo_kills_heals_and_listens_on_loopback_only(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFT_")}
    env |= {"PYTHONUNBUFFERED": "1", "TORCHFT_BIND_HOST": "0.0.0.0"}  # the shell's bind
    out_path = tmp_path / "demo.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "examples/demo.py", "--steps", "8", "--kill-step", "3"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=DEMO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the demo and every replica it forked
            proc.wait(timeout=10)
    output = out_path.read_text(errors="replace")
    if code is None:
        pytest.fail(f"the demo did not finish in {DEMO_TIMEOUT_S:g} s:\n{output[-3000:]}")
    assert code == 0, output[-3000:]
    assert output.rstrip().endswith("ok"), output[-3000:]
    assert "replica 1 died; restarting it" in output  # the kill and the heal happened
    assert "parameters identical across replicas  yes" in output
    exposed = [line for line in output.splitlines() if EXPOSED.search(line)]
    assert not exposed, "\n".join(exposed[:3])
