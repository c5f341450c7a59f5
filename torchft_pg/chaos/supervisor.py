"""Runs a lighthouse and N replica groups on this machine, injects a fault plan, checks invariants.

Used by `make demo`, the chaos tests and `bench/recovery.py`. Replica
processes come from a forkserver that has imported torch once, so a restart
costs tens of milliseconds rather than an interpreter start-up (torchrun
would pay that; the benchmark reports the library's share separately).
Every process is stopped by its own pid when the run ends, whatever happens.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from torchft_pg.chaos.plan import Fault, FaultPlan
from torchft_pg.chaos.trainer import GO_KEY, TrainerConfig, run_trainer

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos"]

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "torchft_pg", "torchft_pg.chaos._warm"])


@dataclass(frozen=True)
class ChaosConfig:
    """A run: `replicas` groups of `group_world_size` ranks train `steps` steps. Times in seconds."""

    replicas: int = 3
    steps: int = 20
    plan: FaultPlan = field(default_factory=FaultPlan)
    group_world_size: int = 1
    pg_kind: str = "gloo"
    transport: str = "http"  # or "pg"
    min_replicas: int = 1
    join_timeout_ms: int = 300
    timeout_s: float = 5.0
    quorum_timeout_s: float = 60.0
    delay_s: float = 0.6  # > join timeout: a delayed replica misses a quorum
    deadline_s: float = 300.0  # the whole run; past it everything is killed and the run fails
    hidden: int = 64
    seed: int = 0
    step_time_s: float = 0.02  # simulated compute per step, so survivors do not race ahead
    verbose: bool = True


@dataclass
class ChaosReport:
    """What happened and whether the invariants held (`failures` empty)."""

    final_steps: dict[int, int] = field(default_factory=dict)
    checksums: dict[int, str] = field(default_factory=dict)
    commits: int = 0
    faults_fired: list[tuple[int, int, str]] = field(default_factory=list)
    kills: int = 0
    restarts: int = 0
    lighthouse_restarts: int = 0
    kill_to_survivor_commit_s: list[float] = field(default_factory=list)
    restart_to_commit_s: list[float] = field(default_factory=list)
    library_start_s: list[float] = field(
        default_factory=list
    )  # restarted replica: Manager construction
    # restarted replica: from Manager ready to its first commit (quorum, heal, one step)
    ready_to_commit_s: list[float] = field(default_factory=list)
    # ... of which: waiting for its quorum (the survivors finishing their step),
    # reconfiguring the PG, healing (Manager.last_quorum_timings, summed to the first commit)
    join_quorum_s: list[float] = field(default_factory=list)
    join_configure_s: list[float] = field(default_factory=list)
    join_heal_s: list[float] = field(default_factory=list)
    quorum_ids: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


class _Events:
    """The child's end of its event pipe, with a queue's `put`."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def put(self, event: Any) -> None:
        self._conn.send(event)


def _child(config: TrainerConfig, conn: Connection) -> None:
    run_trainer(config, _Events(conn))


@dataclass
class _Rank:
    replica: int
    group_rank: int
    incarnation: int
    proc: Any
    conn: Connection
    done: bool = False
    ready: bool = False


class _Run:
    def __init__(self, config: ChaosConfig, out: Callable[[str], None]) -> None:
        self.c = config
        self.out = out
        self.report = ChaosReport()
        self.start = time.time()
        # The job's committed step outlives a lighthouse restart (as the CLI keeps it).
        self.state_dir = tempfile.mkdtemp(prefix="torchft-pg-chaos-")
        self.lighthouse = self._start_lighthouse("127.0.0.1:0")
        self.lh_port = int(self.lighthouse.address().rsplit(":", 1)[1])
        self.ranks: list[_Rank] = []
        self.stores: dict[int, TCPStore] = {}
        self.incarnations: dict[int, int] = {}
        self.fired: set[tuple[int, int]] = set()
        self.pending_kill: dict[int, float] = {}  # replica -> time its kill fault fired
        self.awaiting_survivor: list[tuple[int, float]] = []  # (killed replica, kill time)
        self.awaiting_restart: dict[int, float] = {}  # replica -> restart time
        self.last_step: dict[
            tuple[int, int], int
        ] = {}  # (replica, incarnation) -> last committed step
        self.step_quorum: dict[int, str] = {}  # step -> the quorum that committed it
        self.epoch_of_last: dict[int, str] = {}  # replica -> epoch of its last commit
        self.ready_at: dict[int, float] = {}  # restarted replica -> when its Manager was ready
        self.epochs_seen: list[str] = []

    def _start_lighthouse(self, bind: str) -> LighthouseServer:
        return LighthouseServer(
            bind=bind,
            min_replicas=self.c.min_replicas,
            join_timeout_ms=self.c.join_timeout_ms,
            state_file=os.path.join(self.state_dir, "lighthouse.state.json"),
        )

    def t(self) -> float:
        return time.time() - self.start

    def start_group(self, replica: int) -> None:
        inc = self.incarnations.get(replica, -1) + 1
        self.incarnations[replica] = inc
        store = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        self.stores[replica] = store  # replaces (and closes) the previous incarnation's store
        if inc > 0:
            store.set(GO_KEY, "1")  # a restarted group starts at once and heals
        for group_rank in range(self.c.group_world_size):
            parent, child = _CTX.Pipe(duplex=False)
            cfg = TrainerConfig(
                replica=replica,
                lighthouse_addr=f"127.0.0.1:{self.lh_port}",
                store_port=store.port,
                steps=self.c.steps,
                plan=self.c.plan,
                fired=frozenset(self.fired),
                incarnation=inc,
                group_rank=group_rank,
                group_world_size=self.c.group_world_size,
                pg_kind=self.c.pg_kind,
                transport=self.c.transport,
                hidden=self.c.hidden,
                seed=self.c.seed,
                timeout_s=self.c.timeout_s,
                quorum_timeout_s=self.c.quorum_timeout_s,
                delay_s=self.c.delay_s,
                expected_replicas=self.c.replicas,
                step_time_s=self.c.step_time_s,
            )
            proc = _CTX.Process(
                target=_child, args=(cfg, child), daemon=True, name=f"replica{replica}.{group_rank}"
            )
            proc.start()
            child.close()
            self.ranks.append(_Rank(replica, group_rank, inc, proc, parent))

    def kill_group(self, replica: int) -> None:
        """SIGKILL every rank of the replica's current incarnation and forget them."""
        for r in self.ranks:
            if r.replica == replica and not r.done:
                if r.proc.is_alive() and r.proc.pid is not None:
                    os.kill(r.proc.pid, signal.SIGKILL)
                r.proc.join(timeout=10)
                r.conn.close()
                r.done = True
        self.ranks = [r for r in self.ranks if r.replica != replica]

    def on_event(self, rank: _Rank, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "step":
            _, replica, group_rank, inc, step, committed, qid, participants, loss, at = event
            if group_rank != 0:
                return
            if self.c.verbose:
                self.out(
                    f"[{at - self.start:7.2f}s] replica {replica} (inc {inc}) step {step:3d} "
                    f"{'committed' if committed else 'DISCARDED'} quorum {qid} "
                    f"participants {participants} loss {loss:.4f}"
                )
            if not committed:
                return
            self.report.commits += 1
            self.report.quorum_ids.append(qid)
            epoch = qid.split("/")[0]
            if epoch not in self.epochs_seen:
                self.epochs_seen.append(epoch)
            elif self.epoch_of_last.get(replica, epoch) != epoch and self.epochs_seen.index(
                epoch
            ) < self.epochs_seen.index(self.epoch_of_last[replica]):
                self.report.failures.append(
                    f"replica {replica} went back to an old lighthouse epoch: {qid}"
                )
            self.epoch_of_last[replica] = epoch
            key = (replica, inc)
            if step <= self.last_step.get(key, -1):
                self.report.failures.append(
                    f"replica {replica} step went backwards: {step} after {self.last_step[key]}"
                )
            # One step, one quorum: two quorums committing the same step would be a
            # split brain, and one of their histories would be lost at the next heal.
            first = self.step_quorum.setdefault(step, qid)
            if first != qid:
                self.report.failures.append(
                    f"step {step} committed in two quorums: {first} and {qid} (replica {replica})"
                )
            self.last_step[key] = step
            for killed, at_kill in list(self.awaiting_survivor):
                if replica != killed and at > at_kill:
                    self.report.kill_to_survivor_commit_s.append(at - at_kill)
                    self.awaiting_survivor.remove((killed, at_kill))
            if replica in self.awaiting_restart:
                self.report.restart_to_commit_s.append(at - self.awaiting_restart.pop(replica))
                if replica in self.ready_at:
                    self.report.ready_to_commit_s.append(at - self.ready_at.pop(replica))
        elif kind == "fault":
            _, replica, step, fault, at = event
            if (replica, step) in self.fired:
                return  # every rank of a group announces the same fault
            self.fired.add((replica, step))
            self.report.faults_fired.append((replica, step, fault))
            self.out(f"[{at - self.start:7.2f}s] FAULT {fault} on replica {replica} at step {step}")
            if fault == Fault.KILL_REPLICA.value:
                self.pending_kill[replica] = at
            elif fault == Fault.RESTART_LIGHTHOUSE.value:
                self.restart_lighthouse()
        elif kind == "ready":
            rank.ready = True
            if rank.incarnation > 0 and rank.group_rank == 0:
                self.report.library_start_s.append(event[4])
                self.ready_at[rank.replica] = event[5]
            elif rank.incarnation == 0 and all(r.ready for r in self.ranks if r.incarnation == 0):
                for store in self.stores.values():
                    store.set(GO_KEY, "1")  # every first incarnation starts together
        elif kind == "join":
            if event[2] == 0:
                self.report.join_quorum_s.append(event[4])
                self.report.join_configure_s.append(event[5])
                self.report.join_heal_s.append(event[6])
        elif kind == "done":
            _, replica, group_rank, _inc, step, checksum, _at = event
            rank.done = True
            if group_rank == 0:
                self.report.final_steps[replica] = step
                self.report.checksums[replica] = checksum
        elif kind == "error":
            self.report.failures.append(f"replica {event[1]} rank {event[2]} raised: {event[4]}")

    def restart_lighthouse(self) -> None:
        self.lighthouse.shutdown()
        self.lighthouse = self._start_lighthouse(f"127.0.0.1:{self.lh_port}")
        self.report.lighthouse_restarts += 1
        self.out(f"[{self.t():7.2f}s] lighthouse restarted on the same address, epoch changes")

    def on_exit(self, rank: _Rank) -> None:
        if rank.done:
            return
        replica = rank.replica
        if replica in self.pending_kill:
            at = self.pending_kill.pop(replica)
            self.report.kills += 1
            self.awaiting_survivor.append((replica, at))
            self.kill_group(replica)  # the replica group is the failure domain
            self.out(f"[{self.t():7.2f}s] replica {replica} died (SIGKILL); restarting it")
            self.report.restarts += 1
            self.awaiting_restart[replica] = time.time()
            self.start_group(replica)
        else:
            self.report.failures.append(
                f"replica {replica} rank {rank.group_rank} exited unexpectedly (code {rank.proc.exitcode})"
            )
            rank.done = True

    def loop(self) -> None:
        for replica in range(self.c.replicas):
            self.start_group(replica)
        deadline = self.start + self.c.deadline_s
        while any(not r.done for r in self.ranks):
            left = deadline - time.time()
            if left <= 0:
                self.report.failures.append(
                    f"run did not finish within {self.c.deadline_s} s (hang?)"
                )
                return
            live = [r for r in self.ranks if not r.done]
            ready = wait(
                [r.conn for r in live] + [r.proc.sentinel for r in live], timeout=min(left, 5.0)
            )
            for r in live:
                while r.conn in ready and r.conn.poll():
                    try:
                        self.on_event(r, r.conn.recv())
                    except EOFError:
                        break
            for r in live:
                if r.proc.sentinel in ready and not r.done:
                    while r.conn.poll():  # drain what it sent before dying
                        try:
                            self.on_event(r, r.conn.recv())
                        except EOFError:
                            break
                    r.proc.join(timeout=5)
                    self.on_exit(r)
            if self.report.failures:
                return

    def finish(self) -> ChaosReport:
        grace = time.time() + (5.0 if not self.report.failures else 0.0)
        for r in self.ranks:
            if r.done:  # finished ranks shut down cleanly (their replica leaves the lighthouse)
                r.proc.join(timeout=max(0.0, grace - time.time()))
            if r.proc.is_alive() and r.proc.pid is not None:
                os.kill(r.proc.pid, signal.SIGKILL)
            r.proc.join(timeout=10)
            r.conn.close()
        self.lighthouse.shutdown()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.stores.clear()
        rep = self.report
        rep.wall_s = self.t()
        if not rep.failures:
            if sorted(rep.final_steps) != list(range(self.c.replicas)):
                rep.failures.append(f"not every replica finished: {rep.final_steps}")
            elif (
                len(set(rep.final_steps.values())) != 1
                or min(rep.final_steps.values()) < self.c.steps
            ):
                rep.failures.append(
                    f"replicas ended at different or short steps: {rep.final_steps}"
                )
            elif len(set(rep.checksums.values())) != 1:
                rep.failures.append(f"replicas differ at the end: {rep.checksums}")
        return rep


def run_chaos(config: ChaosConfig, out: Callable[[str], None] = print) -> ChaosReport:
    """Run the plan and return the report; never leaves a process behind."""
    run = _Run(config, out)
    try:
        out(
            f"chaos: {config.replicas} replica groups x {config.group_world_size} ranks, {config.steps} steps, "
            f"lighthouse {run.lighthouse.address()}; plan: {config.plan.describe()}"
        )
        run.loop()
    finally:
        report = run.finish()
    return report
