"""Replica groups of `titan_worker` processes, launched as torchrun launches them.

Each group gets a TCPStore hosted by the test process (as torchrun's agent
hosts it: workers connect with ``TORCHELASTIC_USE_AGENT_STORE``), one process
per rank with torchrun's environment, and a thread reading each rank's JSON
lines. Every process is killed by its own pid on exit, also when a test fails;
stderr goes to a file per rank, printed when a test fails.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch.distributed import TCPStore

ROOT = Path(__file__).resolve().parents[2]
GROUP_SIZE = 2


def new_store() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


@dataclass
class Group:
    """One replica group: its store and its ranks' processes."""

    replica: int
    store: TCPStore
    procs: list[subprocess.Popen[str]]
    logs: list[Path]


@dataclass
class Job:
    """Replica groups stepping against one lighthouse; `events` gets every JSON line."""

    lighthouse: str
    mode: str
    groups_total: int
    test_store: TCPStore
    workdir: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    groups: dict[int, Group] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)  # every event waited past
    final: dict[int, dict[str, Any]] = field(default_factory=dict)  # replica -> full parameters
    _starts: int = 0

    def start_group(self, replica: int) -> Group:
        """Start replica group `replica` (again, after a kill: a fresh store, as a new torchrun)."""
        store = new_store()
        procs, logs = [], []
        self._starts += 1
        for rank in range(GROUP_SIZE):
            log = self.workdir / f"r{replica}-{rank}-{self._starts}.log"
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(GROUP_SIZE),
                "LOCAL_WORLD_SIZE": str(GROUP_SIZE),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHFT_LIGHTHOUSE": self.lighthouse,
                "TORCHFT_BIND_HOST": "127.0.0.1",
                "TITAN_REPLICA": str(replica),
                "TITAN_GROUPS": str(self.groups_total),
                "TITAN_TEST_STORE": str(self.test_store.port),
                **self.env,
            }
            with open(log, "w") as err:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.torchtitan.titan_worker",
                        self.mode,
                        *self.extra_args,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    cwd=ROOT,
                    env=env,
                )
            threading.Thread(target=self._pump, args=(proc,), daemon=True).start()
            procs.append(proc)
            logs.append(log)
        group = Group(replica, store, procs, logs)
        self.groups[replica] = group
        return group

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put({"event": "exit", "pid": proc.pid})

    def kill_group(self, replica: int) -> None:
        """SIGKILL every rank of group `replica` and reap them."""
        for proc in self.groups[replica].procs:
            proc.send_signal(signal.SIGKILL)
        for proc in self.groups[replica].procs:
            proc.wait(timeout=30)

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool], what: str, idle_s: float = 90.0
    ) -> dict[str, Any]:
        """The next event matching `pred`. Fails after `idle_s` seconds without
        any event at all (a deadline on progress, not on the whole wait), or when
        a rank exits with an error meanwhile."""
        while True:
            try:
                event = self.events.get(timeout=idle_s)
            except queue.Empty:
                raise AssertionError(f"no event for {idle_s} s while waiting for {what}") from None
            self.seen.append(event)
            if event.get("event") == "exit":
                self._check_exit(event["pid"])
            if pred(event):
                return event

    def _check_exit(self, pid: int) -> None:
        for group in self.groups.values():
            for proc, log in zip(group.procs, group.logs, strict=True):
                if proc.pid == pid:
                    rc = proc.wait(timeout=30)
                    if rc not in (0, -signal.SIGKILL):
                        raise AssertionError(f"{log.name} exited with {rc}:\n{tail(log)}")

    def wait_all_exit(self, idle_s: float = 90.0) -> None:
        """Wait until every live rank process has exited cleanly."""
        while any(p.poll() is None for g in self.groups.values() for p in g.procs):
            self.wait_for(lambda e: e.get("event") == "exit", "the ranks to exit", idle_s)
        for group in self.groups.values():
            for proc, log in zip(group.procs, group.logs, strict=True):
                if proc.returncode not in (0, -signal.SIGKILL):
                    raise AssertionError(f"{log.name} exited with {proc.returncode}:\n{tail(log)}")

    def stop_at(self, step: int) -> None:
        """Every rank stops once its committed step reaches `step`."""
        self.test_store.set("stop", str(step))

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{tail(log)}" for g in self.groups.values() for log in g.logs
        )


@contextmanager
def torchft_lighthouse(*flags: str) -> Iterator[str]:
    """torchft's ``torchft_lighthouse`` command (installed by torchft-pg-compat) with
    `flags`, on an ephemeral loopback port; yields its ``http://host:port``.
    Killed by its pid on exit."""
    command = Path(sys.executable).parent / "torchft_lighthouse"
    proc = subprocess.Popen(
        [str(command), *flags, "--bind", "127.0.0.1:0", "--http_bind", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once serving; EOF if it failed to start
        match = re.match(r"lighthouse listening on (http://\S+) ", first)
        assert match, f"torchft_lighthouse {flags} did not start: {first!r} (rc {proc.poll()})"
        yield match.group(1)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def job(
    lighthouse: str,
    mode: str,
    groups: int,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Job]:
    """A `Job` (`env`: more variables for every rank); every rank still running at
    exit is SIGKILLed by its pid."""
    with tempfile.TemporaryDirectory() as tmp:
        j = Job(lighthouse, mode, groups, new_store(), Path(tmp), extra_args or [], env or {})
        try:
            yield j
        except BaseException:
            print(j.logs(), file=sys.stderr)
            raise
        finally:
            for group in j.groups.values():
                for proc in group.procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(timeout=30)
