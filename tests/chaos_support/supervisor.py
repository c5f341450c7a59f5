"""Runs a lighthouse and N replica groups on this machine, injects a fault plan, checks invariants.

Used by `make demo`, the chaos tests and `bench/recovery.py`. Replica
processes come from a forkserver that has imported torch once, so a restart
costs tens of milliseconds rather than an interpreter start-up (torchrun
would pay that; the benchmark reports the library's share separately).
Every process is stopped by its own pid when the run ends, whatever happens.

The plan's fault groups are released one at a time, each once the job has
recovered from the previous one (`schedule.py`), so each fault hits a
recovered job and some replica always holds the committed state; a run lasts
at least `steps` steps, and until the last group fired and the job recovered.
The ledger (`ledger.py`) checks each commit as it arrives; at the end every
replica must hold the same state, and the oracle (`oracle.py`) replays the
committed history and compares it with each one. A run fails as hung once no
rank sent an event or exited for `stall_s` seconds, or past `deadline_s`
(`progress.py`), never merely because a loaded machine made it slow.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from lighthouse._loop import background_loop
from tests.chaos_support import diloco_oracle, oracle
from tests.chaos_support import events as ev
from tests.chaos_support.config import ChaosConfig, ChaosReport
from tests.chaos_support.data_oracle import check_stream
from tests.chaos_support.diloco_events import OuterStepEnded, TraceEvent
from tests.chaos_support.diloco_workload import Algorithm
from tests.chaos_support.ledger import Ledger
from tests.chaos_support.outer_ledger import OuterLedger
from tests.chaos_support.progress import ProgressWatch
from tests.chaos_support.schedule import FaultSchedule
from tests.chaos_support.trainer import GO_KEY, TrainerConfig, run_trainer
from tests.chaos_support.workload import FlatState, Workload
from torchft_pg.chaos.plan import Fault

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos"]

_CTX = mp.get_context("forkserver")
LIGHTHOUSE = -1  # what the fault schedule holds while the lighthouse is away
# What the forkserver imports before forking replicas (`_warm`: torch's lazy
# imports paid once). The process has one forkserver and one preload list, which
# other modules set too at their import (tests.multiproc, the benchmarks), and
# the last call before the server starts wins: `run_chaos` sets it, at run time.
_PRELOAD = ["torch", "torch.distributed", "torchft_pg", "tests.chaos_support._warm"]


class _Pipe:
    """The child's end of its pipe: a queue's `put` for events (from any of its
    threads), and `poll`/`recv` for the supervisor's messages."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def put(self, event: Any) -> None:
        with self._lock:
            self._conn.send(event)

    def poll(self) -> bool:
        return self._conn.poll()

    def recv(self) -> Any:
        return self._conn.recv()


def _child(config: TrainerConfig, conn: Connection) -> None:
    pipe = _Pipe(conn)
    run_trainer(config, pipe, pipe)


@dataclass
class _Rank:
    replica: int
    group_rank: int
    incarnation: int
    proc: Any
    conn: Connection
    done: bool = False  # finished, or gone: no more events expected
    ready: bool = False
    dying: ev.Dying | None = None
    orphaned: bool = False  # raised after a peer of its group died: its exit is expected
    frozen: tuple[float, float, int, int] | None = None  # (at, resume at, step, others' max step)


class _Run:
    def __init__(self, config: ChaosConfig, out: Callable[[str], None]) -> None:
        self.c = config
        self.out = out
        self.report = ChaosReport()
        self.start = time.time()
        self.progress = ProgressWatch(
            stall_s=config.stall_s, deadline_s=config.deadline_s, started=time.monotonic()
        )
        self.ledger = Ledger(
            Workload(seed=config.seed, hidden=config.hidden),
            detect_within=config.integrity_check_every,
        )
        self.straggle_began: dict[int, int] = {}  # straggling replica -> step it began
        # DiLoCo: every rank's trace, for the outer-step checks and the DiLoCo replay
        self.outer = (
            OuterLedger(Workload(seed=config.seed, hidden=config.hidden), config.diloco)
            if config.algorithm == Algorithm.DILOCO
            else None
        )
        # The job's committed step outlives a lighthouse restart (as the CLI keeps it).
        self.state_dir = tempfile.mkdtemp(prefix="torchft-pg-chaos-")
        self.lighthouse = self._start_lighthouse("127.0.0.1:0")
        self.lh_port = int(self.lighthouse.address().rsplit(":", 1)[1])
        self.ranks: list[_Rank] = []
        self.stores: dict[int, TCPStore] = {}
        self.incarnations: dict[int, int] = {}
        self.schedule = FaultSchedule(config.plan, config.replicas)
        # replica -> (when its remaining ranks are stopped at the latest, the step its rank died in)
        self.group_down_by: dict[int, tuple[float, int]] = {}
        self.awaiting_survivor: list[tuple[int, float]] = []  # (killed replica, kill time)
        self.awaiting_restart: dict[int, float] = {}  # replica -> restart time
        self.ready_at: dict[int, float] = {}  # restarted replica -> when its Manager was ready
        self.finals: dict[str, FlatState] = {}
        self.lighthouse_away_s = (
            config.lighthouse_away_s
            if config.lighthouse_away_s is not None
            else (config.heartbeat_timeout_ms or 5000) / 1000 + 1.0
        )
        # the lighthouse away: (fault, since, back at, commits then); None while it is up
        self.away: tuple[str, float, float, int] | None = None
        # after an outage: the restarted lighthouse's epoch, and the replicas that
        # committed in it so far (the schedule holds until all have)
        self.new_epoch: tuple[str, set[int]] | None = None
        self.freeze_s = (
            config.freeze_s
            if config.freeze_s is not None
            else (config.heartbeat_timeout_ms or 5000) / 1000 + config.timeout_s + 1.0
        )

    def _start_lighthouse(self, bind: str) -> LighthouseServer:
        options: dict[str, Any] = {}
        if self.c.straggler_window is not None:
            options["straggler_window"] = self.c.straggler_window
        if self.c.quarantine_base_ms is not None:
            options["quarantine_base_ms"] = self.c.quarantine_base_ms
        return LighthouseServer(
            bind=bind,
            min_replicas=self.c.min_replicas,
            join_timeout_ms=self.c.join_timeout_ms,
            heartbeat_timeout_ms=self.c.heartbeat_timeout_ms,
            state_file=os.path.join(self.state_dir, "lighthouse.state.json"),
            job_secret=self.c.job_secret,
            **options,
        )

    def harvest_lighthouse(self) -> None:
        """Keep what the lighthouse recorded (findings, quarantines) before it stops."""
        try:
            status = self.lighthouse.status()
        except Exception as e:  # a hung lighthouse: the run's other checks speak
            self.say(f"could not read the lighthouse's status: {e}")
            return
        for key, into in (
            ("recent_integrity_findings", self.report.integrity_findings),
            ("recent_quarantines", self.report.quarantines),
        ):
            for entry in status.get(key, []):
                if entry not in into:
                    into.append(entry)

    def t(self) -> float:
        return time.time() - self.start

    def say(self, line: str) -> None:
        self.out(f"[{self.t():7.2f}s] {line}")

    # -- processes ---------------------------------------------------------------
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
            parent, child = _CTX.Pipe(duplex=True)
            cfg = TrainerConfig(
                replica=replica,
                lighthouse_addr=f"127.0.0.1:{self.lh_port}",
                store_port=store.port,
                steps=self.c.steps,
                plan=self.c.plan,
                fired=frozenset(self.schedule.fired),
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
                min_replica_size=self.c.min_replica_size,
                step_time_s=self.c.step_time_s,
                released=tuple(sorted(self.schedule.released.items())),
                finish_at=self.schedule.finish_at,
                log_level=self.c.log_level,
                algorithm=self.c.algorithm,
                diloco=self.c.diloco,
                job_secret=self.c.job_secret,
                integrity_check_every=self.c.integrity_check_every,
                straggle_s=self.c.straggle_s,
                straggle_steps=self.c.straggle_steps,
                data_size=self.c.data_size,
                data_batch=self.c.data_batch,
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
            if r.replica == replica:
                if r.proc.is_alive() and r.proc.pid is not None:
                    # it may exit between the check and the kill (a planned death)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(r.proc.pid, signal.SIGKILL)
                r.proc.join(timeout=10)
                r.conn.close()
                r.done = True
        self.ranks = [r for r in self.ranks if r.replica != replica]
        self.group_down_by.pop(replica, None)
        # a corruption or a straggle dies with the group
        self.ledger.forget_replica(replica)
        self.straggle_began.pop(replica, None)
        self.schedule.unhold(replica, self.schedule.max_step)

    def restart_group(self, replica: int) -> None:
        self.kill_group(replica)  # the replica group is the failure domain
        self.say(f"replica {replica} died; restarting it")
        self.report.restarts += 1
        self.awaiting_restart[replica] = time.time()
        self.schedule.disrupt(self.schedule.max_step)
        self.start_group(replica)

    def lighthouse_goes_away(self, fault: str) -> None:
        """FREEZE_LIGHTHOUSE: its loop blocks (sockets open, nothing answers);
        LIGHTHOUSE_OUTAGE: it shuts down. Either way it is back `lighthouse_away_s` later."""
        if self.away is not None:
            return  # away already: the one in progress stands
        now = time.time()
        if fault == Fault.FREEZE_LIGHTHOUSE.value:
            # The lighthouse's loop (the process's background loop, which only it uses
            # here) sleeps: the stand-in for a SIGSTOP, in this process.
            background_loop().call_soon_threadsafe(time.sleep, self.lighthouse_away_s)
            self.say(f"lighthouse frozen for {self.lighthouse_away_s:.1f} s")
        else:
            self.harvest_lighthouse()
            self.lighthouse.shutdown()
            self.say(f"lighthouse down for {self.lighthouse_away_s:.1f} s")
        self.away = (fault, now, now + self.lighthouse_away_s, self.ledger.commits)
        self.schedule.hold(LIGHTHOUSE)  # the next fault group waits until it is back

    def lighthouse_back(self) -> None:
        assert self.away is not None
        fault, since, _, commits = self.away
        self.away = None
        if fault == Fault.LIGHTHOUSE_OUTAGE.value:
            self.lighthouse = self._start_lighthouse(f"127.0.0.1:{self.lh_port}")
        meanwhile = self.ledger.commits - commits
        self.report.lighthouse_away.append((fault, time.time() - since, meanwhile))
        if fault == Fault.LIGHTHOUSE_OUTAGE.value:
            # A new epoch: the groups' leases end as their streams reopen and they meet
            # in its first quorum (heals included). Until every group committed there,
            # the next fault group waits: a corruption released before would be the
            # state the re-quorum's healers copy.
            self.new_epoch = (self.lighthouse.epoch, set())
        else:
            self.schedule.unhold(LIGHTHOUSE, self.schedule.max_step)
        self.say(
            f"lighthouse back after {time.time() - since:.1f} s "
            f"({'restarted, a new epoch' if fault == Fault.LIGHTHOUSE_OUTAGE.value else 'resumed'});"
            f" the replicas committed {meanwhile} steps meanwhile"
        )

    def restart_lighthouse(self) -> None:
        if self.away is not None:  # frozen or down already: it comes back on its own
            self.say("lighthouse restart skipped: it is away already")
            return
        self.harvest_lighthouse()
        self.lighthouse.shutdown()
        self.lighthouse = self._start_lighthouse(f"127.0.0.1:{self.lh_port}")
        self.report.lighthouse_restarts += 1
        self.schedule.hold(LIGHTHOUSE)  # until every group committed in the new epoch
        self.new_epoch = (self.lighthouse.epoch, set())
        self.say("lighthouse restarted on the same address, epoch changes")

    # -- fault groups ------------------------------------------------------------
    def release_ready(self) -> None:
        """Release the fault groups that may fire now; after the last, say where to stop."""
        for message in self.schedule.due_messages():
            self.send(message)
            if self.c.verbose and isinstance(message, ev.Release):
                self.say(f"faults planned at step {message.planned_step} released")

    def send(self, message: ev.Release | ev.Finish) -> None:
        for r in self.ranks:
            if not r.done:
                # One that is exiting cannot read it; its exit is handled on its own.
                with contextlib.suppress(OSError):
                    r.conn.send(message)

    # -- events ------------------------------------------------------------------
    def on_event(self, rank: _Rank, event: ev.Event) -> None:
        if self.outer is not None and isinstance(event, (TraceEvent, OuterStepEnded)):
            self.outer.record(event)
        if self.outer is not None and isinstance(event, ev.Done):
            self.outer.done(event)
        if isinstance(event, ev.StepEnded):
            self.on_step(event)
        elif isinstance(event, ev.Contribution):
            self.ledger.contribution(event)
        elif isinstance(event, ev.FaultFired):
            if not self.schedule.fire(event.replica, event.planned_step, event.step):
                return  # every rank of a group announces the same fault
            self.report.faults_fired.append((event.replica, event.planned_step, event.fault))
            self.say(
                f"FAULT {event.fault} on replica {event.replica} (planned at step {event.planned_step})"
            )
            if event.fault == Fault.RESTART_LIGHTHOUSE.value:
                self.restart_lighthouse()
            elif event.fault in (Fault.FREEZE_LIGHTHOUSE.value, Fault.LIGHTHOUSE_OUTAGE.value):
                self.lighthouse_goes_away(event.fault)
            elif event.fault in (Fault.CORRUPT_STATE.value, Fault.STRAGGLE.value):
                self.schedule.hold(event.replica)  # until caught and healed, or keeping pace
                if event.fault == Fault.STRAGGLE.value:
                    self.straggle_began[event.replica] = event.step
        elif isinstance(event, ev.Corrupted):
            self.ledger.corruption(event)
            self.say(
                f"replica {event.replica} rank {event.group_rank}: bit {event.bit} of element "
                f"{event.index} of {event.tensor} flipped at step {event.step}"
            )
        elif isinstance(event, ev.StraggleEnded):
            began = self.straggle_began.pop(event.replica, None)
            if began is not None:
                self.report.straggles.append((event.replica, began, event.step, event.healed))
                self.schedule.unhold(event.replica, event.step)
                self.say(
                    f"replica {event.replica} keeps pace again at step {event.step} "
                    f"({'it was left out and healed back in' if event.healed else 'its slow steps ran out'})"
                )
        elif isinstance(event, ev.Dying):
            rank.dying = event
            self.ledger.death(event)
            self.report.deaths.append((event.replica, event.group_rank, event.step, event.phase))
            self.schedule.disrupt(event.step)
            if not any(r.dying for r in self.ranks if r.replica == rank.replica and r is not rank):
                self.report.kills += 1
                self.awaiting_survivor.append((event.replica, event.at))
            self.say(
                f"replica {event.replica} rank {event.group_rank} dies in {event.phase} "
                f"at step {event.step}"
            )
        elif isinstance(event, ev.Frozen):
            others = self.schedule.max_step
            rank.frozen = (time.time(), time.time() + self.freeze_s, event.step, others)
            self.schedule.disrupt(event.step)
            self.say(
                f"replica {event.replica} rank {event.group_rank} froze (SIGSTOP) in {event.phase} "
                f"at step {event.step}; SIGCONT in {self.freeze_s:.1f} s"
            )
        elif isinstance(event, ev.Ready):
            rank.ready = True
            if rank.incarnation > 0 and rank.group_rank == 0:
                self.report.library_start_s.append(event.manager_s)
                self.ready_at[rank.replica] = event.at
            elif rank.incarnation == 0 and all(r.ready for r in self.ranks if r.incarnation == 0):
                for store in self.stores.values():
                    store.set(GO_KEY, "1")  # every first incarnation starts together
        elif isinstance(event, ev.Joined):
            if event.group_rank == 0:
                self.report.join_quorum_s.append(event.quorum_s)
                self.report.join_configure_s.append(event.configure_s)
                self.report.join_heal_s.append(event.heal_s)
        elif isinstance(event, ev.Done):
            rank.done = True
            self.finals[f"replica {event.replica} rank {event.group_rank}"] = event.state
            if event.group_rank == 0:
                self.report.final_steps[event.replica] = event.step
                self.report.checksums[event.replica] = event.checksum
        elif isinstance(event, ev.Error):
            if any(r.dying for r in self.ranks if r.replica == rank.replica and r is not rank):
                rank.orphaned = True
                first = event.message.splitlines()[0]
                self.report.orphan_errors.append((event.replica, event.group_rank, first))
                self.say(f"replica {event.replica} rank {event.group_rank} gave up: {first}")
                return
            self.report.failures.append(
                f"replica {event.replica} rank {event.group_rank} raised: {event.message}"
            )

    def on_step(self, event: ev.StepEnded) -> None:
        self.ledger.step_ended(event)
        if self.new_epoch is not None and event.committed and event.group_rank == 0:
            epoch, seen = self.new_epoch
            if event.quorum.split("/")[0] == epoch:
                seen.add(event.replica)
                if len(seen) == self.c.replicas:
                    self.new_epoch = None
                    self.schedule.unhold(LIGHTHOUSE, event.step)
        while len(self.report.corruptions) < len(self.ledger.healed):
            replica, group_rank, at, healed = self.ledger.healed[len(self.report.corruptions)]
            self.report.corruptions.append((replica, group_rank, at, healed))
            self.say(
                f"replica {replica} rank {group_rank}: its corruption at step {at} was caught; "
                f"it commits the others' state again from step {healed}"
            )
            if replica not in self.ledger.open_corruptions():
                self.schedule.unhold(replica, healed)
        if event.group_rank != 0:
            return
        down = self.group_down_by.get(event.replica)
        if down is not None and event.step >= down[1]:
            self.kill_group_rest(event.replica)  # its rank 0 has ended the step its peer died in
        if self.c.verbose:
            self.out(
                f"[{event.at - self.start:7.2f}s] replica {event.replica} (inc {event.incarnation}) "
                f"step {event.step:3d} {'committed' if event.committed else 'DISCARDED'} "
                f"quorum {event.quorum} participants {event.participants} loss {event.loss:.4f}"
            )
        if not event.committed:
            return
        self.schedule.committed(event.replica, event.step, event.participants)
        for killed, at_kill in list(self.awaiting_survivor):
            if event.replica != killed and event.at > at_kill:
                self.report.kill_to_survivor_commit_s.append(event.at - at_kill)
                self.awaiting_survivor.remove((killed, at_kill))
        if event.replica in self.awaiting_restart:
            self.report.restart_to_commit_s.append(
                event.at - self.awaiting_restart.pop(event.replica)
            )
            if event.replica in self.ready_at:
                self.report.ready_to_commit_s.append(event.at - self.ready_at.pop(event.replica))

    def on_exit(self, rank: _Rank) -> None:
        if rank.done:
            return
        rank.done = True
        if rank.dying is None and not rank.orphaned:
            self.report.failures.append(
                f"replica {rank.replica} rank {rank.group_rank} exited unexpectedly "
                f"(code {rank.proc.exitcode})"
            )
            return
        group = [r for r in self.ranks if r.replica == rank.replica]
        if all(r.done for r in group) or rank.group_rank == 0:
            # Nothing left, or rank 0 (the group's manager server) is gone: restart now.
            self.restart_group(rank.replica)
        elif rank.replica not in self.group_down_by:
            # A partial death: the group's other ranks are stopped (as torchrun would)
            # once its rank 0 has ended this step, and in any case after 3 PG timeouts.
            step = min(r.dying.step for r in group if r.dying is not None)
            self.group_down_by[rank.replica] = (time.time() + 3 * self.c.timeout_s, step)

    def kill_group_rest(self, replica: int) -> None:
        self.say(f"replica {replica}: stopping the ranks that outlived their peer")
        self.restart_group(replica)

    def on_timers(self) -> None:
        now = time.time()
        if self.away is not None and now >= self.away[2]:
            self.lighthouse_back()
        for replica, (by, _) in list(self.group_down_by.items()):
            if now >= by:
                self.kill_group_rest(replica)
        for r in self.ranks:
            if r.frozen is not None and now >= r.frozen[1]:
                at, _, step, others = r.frozen
                r.frozen = None
                if r.proc.is_alive() and r.proc.pid is not None:
                    os.kill(r.proc.pid, signal.SIGCONT)
                progress = self.schedule.max_step - others
                self.report.freezes.append((r.replica, r.group_rank, step, now - at, progress))
                self.schedule.disrupt(self.schedule.max_step)
                self.say(
                    f"replica {r.replica} rank {r.group_rank} resumed (SIGCONT) after "
                    f"{now - at:.1f} s; the others committed {progress} steps meanwhile"
                )

    def next_timer(self) -> float:
        times = [by for by, _ in self.group_down_by.values()]
        times += [r.frozen[1] for r in self.ranks if r.frozen is not None]
        if self.away is not None:
            times.append(self.away[2])
        return min(times, default=time.time() + 5.0)

    def drain(self, r: _Rank) -> None:
        while not r.conn.closed and r.conn.poll():
            try:
                event = r.conn.recv()
            except (EOFError, OSError):
                return
            what = f"{type(event).__name__} from replica {r.replica} rank {r.group_rank}"
            self.progress.progressed(time.monotonic(), what)
            self.on_event(r, event)

    def loop(self) -> None:
        for replica in range(self.c.replicas):
            self.start_group(replica)
        self.release_ready()
        while any(not r.done for r in self.ranks):
            hung = self.progress.failure(time.monotonic())
            if hung is not None:
                self.report.failures.append(hung)
                return
            left = self.progress.left(time.monotonic())
            live = [r for r in self.ranks if not r.done]
            timeout = max(0.0, min(left, 5.0, self.next_timer() - time.time()))
            ready = wait([r.conn for r in live] + [r.proc.sentinel for r in live], timeout=timeout)
            for r in live:
                if r.conn in ready:
                    self.drain(r)
            for r in live:
                if r.proc.sentinel in ready and not r.done and r in self.ranks:
                    self.progress.progressed(
                        time.monotonic(), f"the exit of replica {r.replica} rank {r.group_rank}"
                    )
                    self.drain(r)  # what it sent before dying
                    r.proc.join(timeout=5)
                    self.on_exit(r)
            self.on_timers()
            self.release_ready()
            if self.report.failures or self.ledger.failures or (self.outer and self.outer.failures):
                return

    # -- the end -----------------------------------------------------------------
    def finish(self) -> ChaosReport:
        grace = time.time() + (5.0 if not self.report.failures else 0.0)
        for r in self.ranks:
            if r.done:  # finished ranks shut down cleanly (their replica leaves the lighthouse)
                r.proc.join(timeout=max(0.0, grace - time.time()))
            if r.proc.is_alive() and r.proc.pid is not None:
                os.kill(r.proc.pid, signal.SIGKILL)
            r.proc.join(timeout=10)
            r.conn.close()
        self.harvest_lighthouse()
        self.lighthouse.shutdown()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.stores.clear()
        rep = self.report
        rep.wall_s = self.t()
        self.ledger.finish()
        rep.failures.extend(self.ledger.failures)
        if self.outer is not None:
            rep.failures.extend(self.outer.failures)
            rep.heals = list(self.outer.heals)
        rep.commits = self.ledger.commits
        rep.quorum_ids = self.ledger.quorum_ids
        if not rep.failures:
            self.check_end()
        return rep

    def check_end(self) -> None:
        rep = self.report
        unfired = self.schedule.unfired()
        if sorted(rep.final_steps) != list(range(self.c.replicas)):
            rep.failures.append(f"not every replica finished: {rep.final_steps}")
        elif (
            len(set(rep.final_steps.values())) != 1 or min(rep.final_steps.values()) < self.c.steps
        ):
            rep.failures.append(f"replicas ended at different or short steps: {rep.final_steps}")
        elif len(set(rep.checksums.values())) != 1:
            rep.failures.append(f"replicas differ at the end: {rep.checksums}")
        elif unfired:
            rep.failures.append(
                "planned faults never fired (the run ended first: give it more steps): "
                + ", ".join(
                    f"{self.c.plan.faults[k].value} replica {k[0]} step {k[1]}" for k in unfired
                )
            )
        self.check_findings()
        if rep.failures or not self.c.oracle:
            return
        if self.outer is not None:
            replayed = diloco_oracle.check(self.outer.history(), self.outer_finals())
            rep.oracle_steps = replayed.outer_steps_replayed
            rep.oracle_max_error = replayed.max_error
            rep.failures.extend(f"oracle: {f}" for f in replayed.failures)
            return
        final_step = next(iter(rep.final_steps.values()))
        self.check_data(final_step)
        for group_rank in range(self.c.group_world_size):
            history, problems = self.ledger.history(final_step, group_rank)
            if history is None:
                rep.failures.extend(problems)
                return
            finals = {
                f"replica {replica} rank {group_rank}": self.finals[
                    f"replica {replica} rank {group_rank}"
                ]
                for replica in range(self.c.replicas)
            }
            verdict = oracle.check(history, finals)
            rep.oracle_steps = verdict.steps_replayed
            rep.oracle_max_error = max(rep.oracle_max_error, verdict.max_error)
            rep.oracle_max_loss_error = max(rep.oracle_max_loss_error, verdict.max_loss_error)
            rep.failures.extend(f"oracle: {f}" for f in verdict.failures)

    def check_data(self, final_step: int) -> None:
        """The data-plan oracle: the committed steps used every sample of the dataset
        once per epoch (the last, unfinished epoch: none twice so far)."""
        rep = self.report
        stream, problems = self.ledger.data_stream(final_step, self.c.group_world_size)
        rep.failures.extend(problems)
        rep.data_samples = len(stream)
        rep.failures.extend(check_stream(stream, self.c.data_size))

    def check_findings(self) -> None:
        """Every corruption caught was reported to the lighthouse by its replica, at a
        step between the corruption and the heal."""
        rep = self.report
        for replica, group_rank, at, healed in rep.corruptions:
            found = [
                f
                for f in rep.integrity_findings
                if str(f.get("replica_id", "")).split(":")[0] == f"replica{replica}"
                and at <= int(f.get("step", -1)) <= healed
            ]
            if not found:
                rep.failures.append(
                    f"replica {replica} rank {group_rank}: its corruption at step {at} (healed at "
                    f"step {healed}) is not among the lighthouse's integrity findings "
                    f"({rep.integrity_findings})"
                )

    def outer_finals(self) -> dict[tuple[int, int], FlatState]:
        """Each replica's final state, keyed (replica, incarnation) (DiLoCo only)."""
        assert self.outer is not None
        return {
            key: state
            for key, state in self.outer.finals.items()
            if key[1] == self.incarnations.get(key[0])
        }


def run_chaos(config: ChaosConfig, out: Callable[[str], None] = print) -> ChaosReport:
    """Run the plan and return the report; never leaves a process behind."""
    _CTX.set_forkserver_preload(_PRELOAD)  # effective if no forkserver runs yet
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
