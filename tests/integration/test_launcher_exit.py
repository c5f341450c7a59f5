"""Killing a replica group's torchrun removes the group from the job.

torchrun (torch 2.13) starts its workers in sessions of their own, so a
SIGKILL of torchrun used to leave them training as that group. Here groups
"a" and "b" each run under a real torchrun (2 ranks) against a real
lighthouse: after a's torchrun is killed, a's workers exit by themselves and
b's steps go on with one participant. A second test has torchrun restart a
group in place and checks that it rejoins.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from lighthouse import LighthouseServer

ROOT = Path(__file__).resolve().parents[2]
IDLE_S = 60.0  # the longest wait for the next line from any worker (progress, not wall time)
MAX_LINES = 20_000  # lines (all sources) one wait reads before it gives up


class Lines:
    """JSON lines of several processes, on one queue."""

    def __init__(self, logs: Path) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.logs = logs  # each source's stderr is logs / f"{source}.log"

    def tail(self, source: str) -> str:
        """The end of `source`'s stderr, for a failure message."""
        path = self.logs / f"{source}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def pump(self, proc: subprocess.Popen[str], source: str) -> None:
        def run() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{"):
                    self.queue.put({**json.loads(line), "source": source})

        threading.Thread(target=run, daemon=True).start()

    def wait(self, pred: Any, what: str, source: str) -> dict[str, Any]:
        """The first line of `source` matching `pred`. Fails when `source` says nothing
        for IDLE_S seconds (a deadline on its progress, not on the whole wait), or
        after MAX_LINES of its lines without a match."""
        last = time.monotonic()
        for _ in range(MAX_LINES):
            try:
                line = self.queue.get(timeout=IDLE_S)
            except queue.Empty:
                line = {"source": None}
            if line["source"] == source:
                last = time.monotonic()
                if pred(line):
                    return line
            elif time.monotonic() - last > IDLE_S:
                raise AssertionError(
                    f"{source} said nothing for {IDLE_S} s while waiting for {what}; "
                    f"its stderr ends:\n{self.tail(source)}"
                )
        raise AssertionError(
            f"{MAX_LINES} lines without {what}; {source}'s stderr ends:\n{self.tail(source)}"
        )


def group(
    torchrun: Path, name: str, env: dict[str, str], logs: Path, *flags: str
) -> subprocess.Popen[str]:
    """Replica group `name`: two ranks of launcher_worker under a real torchrun,
    stderr in logs / f"{name}.log". (Every group of a job has the same number of ranks.)"""
    with open(logs / f"{name}.log", "wb") as stderr:
        return subprocess.Popen(
            [
                str(torchrun),
                "--standalone",
                "--nproc_per_node=2",
                *flags,
                "-m",
                "tests.integration.launcher_worker",
            ],
            cwd=ROOT,
            env={**env, "REPLICA_GROUP_ID": name},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


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
def test_killing_torchrun_stops_its_workers_and_the_group_leaves_the_job(tmp_path: Path) -> None:
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000, http_bind=None
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHFT_LIGHTHOUSE": lighthouse.address(),
        "TORCHFT_BIND_HOST": "127.0.0.1",
    }
    env.pop("TORCHFT_EXIT_WITH_LAUNCHER", None)
    lines = Lines(tmp_path)
    torchrun = Path(sys.executable).parent / "torchrun"
    a = group(torchrun, "a", env, tmp_path)
    b = group(torchrun, "b", env, tmp_path)
    lines.pump(a, "a")
    lines.pump(b, "b")
    workers: list[int] = []
    try:
        with killed_at_exit(workers):
            while len(workers) < 2:
                workers.append(
                    lines.wait(
                        lambda e: e["source"] == "a" and e["event"] == "ready", "a's workers", "a"
                    )["pid"]
                )
            lines.wait(
                lambda e: e["source"] == "b" and e["event"] == "step" and e["participants"] == 2,
                "both groups in one step",
                "b",
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
                "b",
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


@pytest.mark.timeout(300)
def test_a_group_restarted_in_place_by_torchrun_rejoins(tmp_path: Path) -> None:
    """torchrun --max-restarts=1 restarts every worker of a group when one fails;
    its store outlives the restart, so the keys the group writes there are
    scoped to the incarnation (a restarted rank used to read the old manager's
    address and retry a dead server for a minute)."""
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000, http_bind=None
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHFT_LIGHTHOUSE": lighthouse.address(),
        "TORCHFT_BIND_HOST": "127.0.0.1",
    }
    lines = Lines(tmp_path)
    torchrun = Path(sys.executable).parent / "torchrun"
    a = group(torchrun, "a", {**env, "CRASH_AT_STEP": "5"}, tmp_path, "--max-restarts=1")
    b = group(torchrun, "b", env, tmp_path)
    lines.pump(a, "a")
    lines.pump(b, "b")
    workers: list[int] = []
    try:
        with killed_at_exit(workers):
            crashed = lines.wait(
                lambda e: e["source"] == "a" and e["event"] == "crash", "a crash", "a"
            )
            workers.append(crashed["pid"])
            for _ in range(2):  # the second incarnation's ranks
                ready = lines.wait(
                    lambda e: e["source"] == "a" and e["event"] == "ready" and e["restart"] == "1",
                    "torchrun to restart a's workers",
                    "a",
                )
                workers.append(ready["pid"])
            back = lines.wait(
                lambda e: (
                    e["source"] == "a"
                    and e["event"] == "step"
                    and e["restart"] == "1"
                    and e["committed"]
                    and e["participants"] == 2
                ),
                "the restarted group to commit with b",
                "a",
            )
            assert back["step"] > 5
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait(timeout=30)
        lighthouse.shutdown()
