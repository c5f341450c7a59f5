"""Helpers for the lighthouse integration tests: servers that always stop, and
replica subprocesses killed by pid even when a test fails."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from lighthouse import LighthouseServer, ManagerQuorumRequest

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def lighthouse(**kw: Any) -> Iterator[LighthouseServer]:
    """A LighthouseServer on 127.0.0.1 that is shut down on exit."""
    kw.setdefault("bind", "127.0.0.1:0")
    server = LighthouseServer(**kw)
    try:
        yield server
    finally:
        server.shutdown()


def quorum_request(
    group_rank: int,
    step: int,
    checkpoint_metadata: str = "",
    timeout: timedelta = timedelta(seconds=10),
    **kw: Any,
) -> ManagerQuorumRequest:
    """Group rank ``group_rank``'s request at ``step``, waiting up to ``timeout``
    (10 s by default); ``kw`` sets the other fields."""
    return ManagerQuorumRequest(
        group_rank=group_rank,
        step=step,
        checkpoint_metadata=checkpoint_metadata,
        timeout=timeout,
        **kw,
    )


class Proc:
    """A ``python -m ...`` child whose stdout JSON lines are read on a thread."""

    def __init__(self, args: list[str]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line)

    def next_line(self, timeout_s: float) -> str:
        """The next stdout line, waiting at most ``timeout_s`` seconds."""
        return self.lines.get(timeout=timeout_s)

    def wait_event(
        self, pred: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> dict[str, Any]:
        """The first JSON line matching ``pred`` within ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching event within {timeout_s} s")
            line = self.lines.get(timeout=remaining)
            if line.startswith("{"):
                ev = json.loads(line)
                if pred(ev):
                    return ev  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


@contextmanager
def processes(*arg_lists: list[str]) -> Iterator[list[Proc]]:
    """Start children; kill every one by pid on exit, even after a failure."""
    procs: list[Proc] = []
    try:
        for args in arg_lists:
            procs.append(Proc(args))
        yield procs
    finally:
        for p in procs:
            p.stop()


def replica_args(lighthouse_addr: str, replica_id: str, step_ms: float = 20.0) -> list[str]:
    return [
        "-m",
        "lighthouse.testing",
        "replica",
        "--lighthouse",
        lighthouse_addr,
        "--replica-id",
        replica_id,
        "--rounds",
        "100000",
        "--step-ms",
        str(step_ms),
    ]
