"""A lighthouse and single-rank replica groups, each in its own network namespace, and the
invariants the chaos supervisor checks, applied to what they report.

`Job(net, replicas=3)` runs ``python -m lighthouse`` in host ``lh``
(198.18.0.1) and `tests/chaos/netns_worker.py` in hosts ``r0``, ``r1``, ...
(198.18.0.11, ...) of a `tests.chaos.netns.Network`. Every process is
started by the job and stopped by its own pid in `close()`, whatever happened.

`Ledger` checks each commit as it arrives (as `tests.chaos_support.ledger` does
for the chaos supervisor): a replica's committed step never goes backwards;
one step, one quorum; every committer of a step holds the same state after it
and divided by the same number of participants. `Job.finish()` then stops
every replica at a common step and checks they all hold the same state.
Every wait has a deadline; a wait that passes it fails the test with the
tail of every process's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from tests.chaos.netns import Network, die_with_parent
from tests.chaos.netns_worker import WorkerConfig

__all__ = ["LH_HOST", "Job", "Ledger", "ReplicaCrashed", "hosts"]

LH_HOST = "lh"
LH_PORT = 29510  # every host has its own namespace, so fixed ports never collide


def hosts(replicas: int) -> dict[str, str]:
    """The lighthouse at 198.18.0.1, replica i at 198.18.0.(11 + i)."""
    return {LH_HOST: "198.18.0.1", **{f"r{i}": f"198.18.0.{11 + i}" for i in range(replicas)}}


class ReplicaCrashed(Exception):
    """A process died of a signal (a native crash such as SIGSEGV or SIGABRT), not of a
    Python error: raised by `Job.wait` with the process's last native error lines."""


@dataclass
class Step:
    replica: int
    step: int
    committed: bool
    quorum: str
    participants: int
    digest: str | None
    error: str | None
    at: float


@dataclass
class Ledger:
    """The invariants on commits (see the module docstring); `failures` names each violation."""

    failures: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    last: dict[int, int] = field(default_factory=dict)  # replica -> its last committed step
    first: dict[int, Step] = field(default_factory=dict)  # step -> its first commit

    def add(self, s: Step) -> None:
        self.steps.append(s)
        if not s.committed:
            return
        if s.step <= self.last.get(s.replica, -1):
            self.failures.append(
                f"replica {s.replica} step went backwards: committed {s.step} after {self.last[s.replica]}"
            )
        self.last[s.replica] = s.step
        first = self.first.setdefault(s.step, s)
        if first.quorum != s.quorum:
            self.failures.append(
                f"step {s.step} committed in two quorums: {first.quorum} (replica "
                f"{first.replica}) and {s.quorum} (replica {s.replica})"
            )
        if first.digest != s.digest:
            self.failures.append(
                f"state after step {s.step} differs: replica {first.replica} {first.digest}, "
                f"replica {s.replica} {s.digest}"
            )
        if first.participants != s.participants:
            self.failures.append(
                f"step {s.step}: replica {first.replica} divided by {first.participants}, "
                f"replica {s.replica} by {s.participants}"
            )

    def commits(self, replica: int, since: float = 0.0) -> list[Step]:
        return [s for s in self.steps if s.replica == replica and s.committed and s.at >= since]

    def max_step(self) -> int:
        return max(self.last.values(), default=-1)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    buf: bytes = b""
    done: dict[str, Any] | None = None
    error: str | None = None
    exited: int | None = None


class Job:
    """See the module docstring. Use as a context manager; `close()` stops everything."""

    def __init__(
        self,
        net: Network,
        *,
        replicas: int = 3,
        min_replicas: int = 2,
        join_timeout_ms: int = 300,
        heartbeat_timeout_ms: int = 1000,
        worker: Callable[[int], WorkerConfig] | None = None,
        out: Callable[[str], None] = print,
    ) -> None:
        self.net = net
        self.replicas = replicas
        self.out = out
        self.start = time.time()
        self.ledger = Ledger()
        self.logdir = tempfile.mkdtemp(prefix="tfpg-netns-")
        self.sel = selectors.DefaultSelector()
        self.procs: dict[str, _Proc] = {}
        self.crashed: list[str] = []  # processes that died of a signal
        self.lh_addr = f"{net.addr(LH_HOST)}:{LH_PORT}"
        self.secret = secrets.token_hex(16)  # the job secret of every process it starts
        self._lh_args = [
            "--bind", self.lh_addr,
            "--min-replicas", str(min_replicas),
            "--join-timeout-ms", str(join_timeout_ms),
            "--heartbeat-timeout-ms", str(heartbeat_timeout_ms),
            "--http-bind", "none",
            "--state-file", "none",
        ]  # fmt: skip
        self._worker = worker or (
            lambda i: WorkerConfig(
                replica=i,
                host=net.addr(f"r{i}"),
                lighthouse=self.lh_addr,
                expected_replicas=replicas,
            )
        )

    def t(self) -> float:
        return time.time() - self.start

    def say(self, line: str) -> None:
        self.out(f"[{self.t():6.2f}s] {line}")

    # -- processes -------------------------------------------------------------
    def _spawn(self, name: str, host: str, argv: list[str]) -> _Proc:
        log = open(os.path.join(self.logdir, f"{name}.log"), "w+b")  # noqa: SIM115
        popen = subprocess.Popen(
            self.net.exec_argv(host, argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            # every process of the job shares one secret: their servers listen beyond
            # loopback (the namespace's address), which needs one
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "PYTHONFAULTHANDLER": "1",
                "TORCHFT_JOB_SECRET": self.secret,
            },
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        assert popen.stdout is not None
        os.set_blocking(popen.stdout.fileno(), False)
        proc = _Proc(name, popen, log)
        self.procs[name] = proc
        self.sel.register(popen.stdout, selectors.EVENT_READ, proc)
        return proc

    def __enter__(self) -> Job:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()
        if exc_type is None and not self.ledger.failures and not self.crashed:
            shutil.rmtree(self.logdir, ignore_errors=True)  # kept only when something failed

    def _start(self) -> None:
        lh = self._spawn(
            "lighthouse", LH_HOST, [sys.executable, "-m", "lighthouse", *self._lh_args]
        )
        self.wait(
            lambda: lh.buf.startswith(b"lighthouse listening"), 60, "the lighthouse to listen"
        )
        self.say(f"lighthouse up: {lh.buf.decode().splitlines()[0]}")
        for i in range(self.replicas):
            cfg = self._worker(i)
            self._spawn(
                f"r{i}", f"r{i}", [sys.executable, "-m", "tests.chaos.netns_worker", cfg.to_json()]
            )
        self.ready: set[int] = set()
        self.wait(lambda: len(self.ready) == self.replicas, 120, "every replica to be ready")
        for i in range(self.replicas):
            self.send(i, "go")

    def send(self, replica: int, command: str) -> None:
        stdin = self.procs[f"r{replica}"].popen.stdin
        assert stdin is not None
        with contextlib.suppress(OSError):
            stdin.write(command.encode() + b"\n")
            stdin.flush()

    def close(self) -> None:
        """Stop every process by its own pid (its session: `ip netns exec` execs it)."""
        for p in self.procs.values():
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
            for stream in (p.popen.stdin, p.popen.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            p.log.close()
        self.procs.clear()
        self.sel.close()

    def log_tail(self, name: str, chars: int = 3000) -> str:
        with open(os.path.join(self.logdir, f"{name}.log"), "rb") as f:
            data = f.read()
        return data[-chars:].decode(errors="replace")

    def _native_error(self, name: str) -> str:
        """The lines of `name`'s log that say why it died natively (terminate, enforce)."""
        lines = self.log_tail(name, 20000).splitlines()
        keep = [ln for ln in lines if "terminate called" in ln or "what():" in ln or "Fatal" in ln]
        return " | ".join(keep[-4:]) or "(no native error message)"

    def diagnostics(self) -> str:
        """Every process's log tail (the whole logs stay in `logdir`)."""
        parts = [f"logs: {self.logdir}"]
        for name, p in self.procs.items():
            parts.append(f"--- {name} (exit {p.popen.poll()}) ---\n{self.log_tail(name)}")
        return "\n".join(parts)

    # -- events ----------------------------------------------------------------
    def _on_line(self, proc: _Proc, line: bytes) -> None:
        if proc.name == "lighthouse":
            return
        try:
            ev = json.loads(line)
        except ValueError:
            self.ledger.failures.append(f"{proc.name} printed a non-JSON line: {line[:200]!r}")
            return
        kind = ev.pop("ev")
        if kind == "ready":
            self.ready.add(int(proc.name[1:]))
        elif kind == "step":
            s = Step(**ev)
            self.ledger.add(s)
            if not s.committed or s.participants < self.replicas:
                self.say(
                    f"replica {s.replica} step {s.step} "
                    f"{'committed' if s.committed else 'DISCARDED'} quorum {s.quorum} "
                    f"participants {s.participants}" + (f" error: {s.error}" if s.error else "")
                )
        elif kind == "done":
            proc.done = ev
        elif kind == "error":
            proc.error = ev["message"]
            self.ledger.failures.append(f"{proc.name} raised: {ev['message']}")

    def pump(self, timeout: float) -> None:
        """Read whatever the processes printed, waiting at most `timeout` seconds."""
        for key, _ in self.sel.select(timeout=max(0.0, timeout)):
            proc: _Proc = key.data
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(key.fileobj)
                proc.exited = proc.popen.wait(timeout=10)
                if proc.done is None and proc.exited < 0:
                    self.crashed.append(
                        f"{proc.name} died of signal {-proc.exited}: {self._native_error(proc.name)}"
                    )
                elif proc.done is None:  # the lighthouse never says done: it must not exit
                    self.ledger.failures.append(f"{proc.name} exited (code {proc.exited})")
                continue
            proc.buf += chunk
            if proc.name == "lighthouse":
                continue
            while b"\n" in proc.buf:
                line, proc.buf = proc.buf.split(b"\n", 1)
                self._on_line(proc, line)

    def wait(self, until: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Pump events until `until()` holds; returns the seconds it took. Fails the test
        (AssertionError with every log's tail) past `timeout_s` or on an invariant violation."""
        start = time.time()
        deadline = start + timeout_s
        while not until():
            if self.crashed:
                raise ReplicaCrashed(
                    f"while waiting for {what}: {self.crashed}\n{self.diagnostics()}"
                )
            if self.ledger.failures:
                raise AssertionError(
                    f"while waiting for {what}: {self.ledger.failures}\n{self.diagnostics()}"
                )
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(
                    f"timed out after {timeout_s} s waiting for {what} (hang?); "
                    f"steps so far: {self.ledger.last}\n{self.diagnostics()}"
                )
            self.pump(min(left, 1.0))
        return time.time() - start

    # -- what tests wait for ---------------------------------------------------
    def committed_with_all(self, replica: int, since: float) -> bool:
        return any(s.participants == self.replicas for s in self.ledger.commits(replica, since))

    def all_in_step(self, since: float) -> bool:
        """Every replica committed a step with every replica taking part, after `since`."""
        return all(self.committed_with_all(i, since) for i in range(self.replicas))

    def finish(self, timeout_s: float = 60.0) -> dict[int, dict[str, Any]]:
        """Stop every replica at a common step; check they all end with the same state."""
        at = self.ledger.max_step() + 3
        for i in range(self.replicas):
            self.send(i, f"finish {at}")
        replicas = [self.procs[f"r{i}"] for i in range(self.replicas)]
        self.wait(
            lambda: all(p.done for p in replicas), timeout_s, f"every replica to finish at {at}"
        )
        finals = {int(p.name[1:]): p.done for p in replicas if p.done is not None}
        steps = {i: d["step"] for i, d in finals.items()}
        sums = {i: d["checksum"] for i, d in finals.items()}
        assert len(set(steps.values())) == 1, f"replicas ended at different steps: {steps}"
        assert len(set(sums.values())) == 1, f"replicas differ at the end: {sums}"
        assert not self.ledger.failures, self.ledger.failures
        self.say(f"finished: every replica at step {steps[0]} with state {sums[0]}")
        return finals
