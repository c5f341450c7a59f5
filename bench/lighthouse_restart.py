"""The lighthouse SIGKILLed and restarted on the same address while replica groups train.

Used by `bench/recovery.py`. The lighthouse runs as its own process (the
`python -m lighthouse` CLI, defaults but no status page and a state file in a
temporary directory), so a kill is a real crash: no stream is ended cleanly,
no recall or notice is sent. Each replica group is one process (Manager +
ProcessGroupGloo, a 20 ms simulated step) reporting every step's outcome and
time on a pipe. Per restart: from the new lighthouse printing that it listens
to every group having committed a step again. Every process is stopped by its
own pid, also when the run fails.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "torchft_pg"])
STEP_S = 0.02  # simulated compute per step
MAX_STEPS = 1_000_000  # a bound on each replica's loop; the controller stops it long before


@dataclass
class RestartReport:
    """Seconds, one entry per restart."""

    down_s: list[float] = field(default_factory=list)  # kill -> listening again (outage)
    listen_to_all_committing_s: list[float] = field(default_factory=list)
    listen_to_first_commit_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def one_rank_group(
    replica_id: str, lighthouse: str, quorum_timeout: timedelta = timedelta(seconds=60)
) -> tuple[Any, Any, Any]:
    """A replica group of one rank in this process, for the benchmarks' replica
    processes: its Manager (ProcessGroupGloo, a 4 KiB state healed from peers),
    the gradient its steps allreduce, and the group's TCPStore, which the caller
    keeps as long as the Manager. `lighthouse` may list standbys after a comma."""
    import torch
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager import Manager

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    weights = torch.zeros(1024)

    def load(state: dict[str, Any]) -> None:
        weights.copy_(state["w"])

    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=60)),
        load_state_dict=load,
        state_dict=lambda: {"w": weights},
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=replica_id,
        init_sync=False,
        quorum_timeout=quorum_timeout,
    )
    return manager, torch.ones(1024), store


def _replica(index: int, lighthouse: str, conn: Connection, stop: Any) -> None:
    manager, grad, _store = one_rank_group(f"lh{index}", lighthouse)
    try:
        for _ in range(MAX_STEPS):
            if stop.is_set():
                break
            time.sleep(STEP_S)  # simulated compute, not synchronization
            manager.start_quorum()
            manager.allreduce(grad).wait()
            committed = manager.should_commit()
            conn.send(("step", index, time.time(), committed))
    except Exception as e:
        conn.send(("error", index, time.time(), f"{type(e).__name__}: {e}"))
    finally:
        manager.shutdown()


class _Lighthouse:
    """The lighthouse CLI on `port`; `listening_at` is when it said it listens (time.time())."""

    def __init__(self, port: int, state_file: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lighthouse",
                "--bind",
                f"127.0.0.1:{port}",
                "--http-bind",
                "none",
                "--state-file",
                state_file,
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it listens (or dies: EOF)
        self.listening_at = time.time()
        if not line.startswith("lighthouse listening on"):
            self.kill()
            raise RuntimeError(f"lighthouse did not start: {line!r}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(
    replicas: int = 3, restarts: int = 6, outages_s: tuple[float, ...] = (0.0, 2.0)
) -> RestartReport:
    """Train `replicas` groups; SIGKILL and restart the lighthouse `restarts` times,
    keeping it down an extra `outages_s[i % len]` seconds each time (a slow restart)."""
    report = RestartReport()
    port = _free_port()
    state_dir = tempfile.mkdtemp(prefix="torchft-pg-bench-lh-")
    state_file = os.path.join(state_dir, "lighthouse.state.json")
    lh = _Lighthouse(port, state_file)
    stop = _CTX.Event()
    conns: list[Connection] = []
    procs = []
    try:
        for i in range(replicas):
            parent, child = _CTX.Pipe(duplex=False)
            p = _CTX.Process(
                target=_replica, args=(i, f"127.0.0.1:{port}", child, stop), daemon=True
            )
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        events: list[tuple[str, int, float, Any]] = []

        def collect(until: float) -> None:
            while True:
                left = until - time.time()
                if left <= 0:
                    return
                ready = wait(conns, timeout=left)
                if not ready:
                    return
                for c in conns[:]:
                    if c not in ready:
                        continue
                    try:
                        ev = c.recv()
                    except EOFError:
                        conns.remove(c)
                        if not conns:
                            return
                        continue
                    events.append(ev)
                    if ev[0] == "error":
                        report.errors.append(f"replica {ev[1]}: {ev[3]}")

        def committed_after(t: float) -> dict[int, float]:
            first: dict[int, float] = {}
            for kind, index, at, ok in events:
                if kind == "step" and ok and at > t and index not in first:
                    first[index] = at
            return first

        def wait_all_committed(after: float, limit_s: float) -> dict[int, float]:
            deadline = time.time() + limit_s
            while time.time() < deadline and not report.errors:
                first = committed_after(after)
                if len(first) == replicas:
                    return first
                collect(min(deadline, time.time() + 0.5))
            return committed_after(after)

        start = time.time()
        if len(wait_all_committed(start, 120)) < replicas:
            raise RuntimeError(f"replica groups did not start committing: {report.errors}")
        for i in range(restarts):
            collect(time.time() + 0.5 + 0.1 * (i % 5))  # train a while; kill at varied points
            t_kill = time.time()
            lh.kill()
            outage = outages_s[i % len(outages_s)]
            if outage:
                time.sleep(outage)  # the lighthouse stays down: the scenario, not a sync
            lh = _Lighthouse(port, state_file)
            t_listen = lh.listening_at
            first = wait_all_committed(t_listen, 60)
            if len(first) < replicas:
                report.errors.append(
                    f"restart {i}: only replicas {sorted(first)} committed within 60 s"
                )
                break
            report.down_s.append(t_listen - t_kill)
            report.listen_to_all_committing_s.append(max(first.values()) - t_listen)
            report.listen_to_first_commit_s.append(min(first.values()) - t_listen)
            events = [ev for ev in events if ev[2] > t_listen]
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=15)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=10)
        lh.kill()
        for name in os.listdir(state_dir):
            os.unlink(os.path.join(state_dir, name))
        os.rmdir(state_dir)
    return report
