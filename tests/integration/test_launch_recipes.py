"""The torchx recipe run for real: ``torchx run -s local_cwd`` of
examples/launch/torchx_component.py starts the lighthouse role and two replica-group
roles (one torchrun of examples/train_ddp.py each, on CPU/Gloo) with a job secret and
the app's id as job id; the app must finish SUCCEEDED, which needs both groups to
commit every step and the lighthouse role to end by itself once they are done.

About 25 s of CPU; on an idle 2-core machine about as long in wall time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = "examples/launch/torchx_component.py:fault_tolerant_job"
STEPS = 5
RUN_TIMEOUT_S = 240.0  # generous: a loaded CI machine; the run itself takes ~25 s of CPU
STOP_GRACE_S = 30.0  # seconds torchx gets to stop its roles after SIGTERM


def free_fixed_port(rng: random.Random, taken: set[int]) -> int:
    """A port no one listens on, below the kernel's ephemeral range (32768 and up on
    Linux), so a port-0 bind elsewhere on the machine cannot take it between this check
    and the lighthouse's own bind seconds later."""
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError("no free port in [20000, 32000) after 200 tries")


def role_logs(log_dir: Path, tail_chars: int = 3000) -> str:
    """The end of every role's log under torchx's ``log_dir``, to say why a run failed."""
    parts = []
    for path in sorted(log_dir.rglob("combined.log")):
        text = path.read_text(errors="replace")
        parts.append(f"--- {path.relative_to(log_dir)} ---\n{text[-tail_chars:]}")
    return "\n".join(parts) or f"(no role logs under {log_dir})"


# This run once hung in `make test` on a clean clone: both groups trained and left
# between two of the lighthouse role's looks at `/status`, so the role never saw a
# live replica and waited for a first join forever (it now also counts an issued
# quorum as a join). It writes its output to a file and runs torchx in its own
# session, so a run that does not end fails with the role logs instead of hanging.
def test_torchx_local_run_trains_two_replica_groups(tmp_path: Path) -> None:
    secret = tmp_path / "job-secret"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    secret.chmod(0o600)
    state_file = tmp_path / "lighthouse.state.json"
    venv_bin = Path(sys.executable).parent
    rng, ports = random.Random(), set[int]()
    # torchx's local schedulers run each role with this process's environment: the
    # venv's python and torchrun come first on PATH.
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    command = [
        str(venv_bin / "torchx"),
        "run",
        "-s",
        "local_cwd",
        "-cfg",
        f"log_dir={tmp_path / 'logs'}",
        COMPONENT,
        "--script",
        "examples/train_ddp.py",
        "--replica_groups",
        "2",
        "--min_replicas",
        "2",
        "--job_secret_file",
        str(secret),
        "--lighthouse_port",
        str(free_fixed_port(rng, ports)),
        "--lighthouse_http_port",
        str(free_fixed_port(rng, ports)),
        "--lighthouse_state_file",
        str(state_file),
        "--exit_when_idle_s",
        "1",
        "--env",
        f"STEPS={STEPS}",
    ]
    # Output goes to a file, not a pipe: a role's process that outlives torchx keeps a
    # pipe open and a read to EOF would then wait forever. torchx runs in its own
    # session so that, if it does not end in time, everything it started is stopped.
    out_path = tmp_path / "torchx.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # torchx stops every role it started
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(
                    proc.pid, signal.SIGKILL
                )  # the session torchx led, and what is left of it
            proc.wait(timeout=STOP_GRACE_S)
            pytest.fail(
                f"torchx run did not finish in {RUN_TIMEOUT_S:g} s:\n"
                f"{out_path.read_text(errors='replace')[-3000:]}\n{role_logs(tmp_path / 'logs')}"
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # no role process outlives the test
    output = out_path.read_text(errors="replace")

    assert proc.returncode == 0, f"{output[-3000:]}\n{role_logs(tmp_path / 'logs')}"
    assert "Job finished: SUCCEEDED" in output
    for group in (0, 1):
        participants = {
            int(step): int(n)
            for step, n in re.findall(
                rf"^replica_group_{group}/0 replica {group} rank 0 step (\d+) committed "
                r"quorum \S+ participants (\d) ",
                output,
                flags=re.MULTILINE,
            )
        }
        # At step 0 one group syncs from the other (init_sync) and contributes nothing.
        want = {1: 1} | {step: 2 for step in range(2, STEPS + 1)}
        assert participants == want, output[-4000:]
    assert "job secret required" in output  # the lighthouse checked every call
    assert "lighthouse_role: job done; stopping the lighthouse" in output
    assert json.loads(state_file.read_text())["committed_step"] >= 1
