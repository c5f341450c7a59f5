"""Killing a replica group's torchrun removes the group from the job.

torchrun (torch 2.13) starts its workers in sessions of their own, so a
SIGKILL of torchrun used to leave them training as that group. Here group
"a" runs under a real torchrun (2 ranks) and group "b" as a plain process,
against a real lighthouse: after torchrun is killed, a's workers exit by
themselves and b's steps go on with one participant.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore

from lighthouse import LighthouseServer

ROOT = Path(__file__).resolve().parents[2]
IDLE_S = 60.0  # the longest wait for the next line from any worker (progress, not wall time)


class Lines:
    """JSON lines of several processes, on one queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()

    def pump(self, proc: subprocess.Popen[str], source: str) -> None:
        def run() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{"):
                    self.queue.put({**json.loads(line), "source": source})

        threading.Thread(target=run, daemon=True).start()

    def wait(self, pred: Any, what: str) -> dict[str, Any]:
        while True:
            try:
                line = self.queue.get(timeout=IDLE_S)
            except queue.Empty:
                raise AssertionError(f"no output for {IDLE_S} s while waiting for {what}") from None
            if pred(line):
                return line


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) has left
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


@contextmanager
def killed_at_exit(pids: list[int]) -> Iterator[None]:
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_killing_torchrun_stops_its_workers_and_the_group_leaves_the_job() -> None:
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000, http_bind=None
    )
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHFT_LIGHTHOUSE": lighthouse.address(),
        "TORCHFT_BIND_HOST": "127.0.0.1",
    }
    env.pop("TORCHFT_EXIT_WITH_LAUNCHER", None)
    lines = Lines()
    torchrun = Path(sys.executable).parent / "torchrun"
    a = subprocess.Popen(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "tests.integration.launcher_worker",
        ],
        cwd=ROOT,
        env={**env, "REPLICA_GROUP_ID": "a"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    b = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.launcher_worker"],
        cwd=ROOT,
        env={
            **env,
            "REPLICA_GROUP_ID": "b",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines.pump(a, "a")
    lines.pump(b, "b")
    workers: list[int] = []
    try:
        with killed_at_exit(workers):
            while len(workers) < 2:
                workers.append(
                    lines.wait(
                        lambda e: e["source"] == "a" and e["event"] == "ready", "a's workers"
                    )["pid"]
                )
            lines.wait(
                lambda e: e["source"] == "b" and e["event"] == "step" and e["participants"] == 2,
                "both groups in one step",
            )
            a.send_signal(signal.SIGKILL)  # torchrun itself, not its workers
            a.wait(timeout=30)
            lines.wait(
                lambda e: (
                    e["source"] == "b"
                    and e["event"] == "step"
                    and e["committed"]
                    and e["participants"] == 1
                ),
                "b to commit without a",
            )
            # Each worker notices within half a second and leaves (SIGTERM, at worst
            # an exit 2 s later): give them 5 s, as a user would wait for them.
            gone = threading.Event()
            for _ in range(50):
                left = [pid for pid in workers if alive(pid)]
                if not left:
                    break
                gone.wait(0.1)
            assert not left, f"torchrun's workers {left} still run 5 s after torchrun was killed"
    finally:
        b.kill()
        b.wait(timeout=30)
        if a.poll() is None:
            a.kill()
            a.wait(timeout=30)
        lighthouse.shutdown()
