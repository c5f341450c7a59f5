"""The lighthouse's event-loop side: pending long-polls, liveness streams, ticks.

``LighthouseCore`` glues ``QuorumState``/``decide_quorum`` to asyncio futures. It
runs on one event loop and is never touched from another thread, so it needs
no lock. Work per request is O(1) plus, when a quorum issues, O(N) to build
and serialize it once for all N members.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from dataclasses import asdict
from typing import Any, Protocol

from lighthouse import wire
from lighthouse.clock import Clock
from lighthouse.coordinator.health import replica_health
from lighthouse.coordinator.history import HistoryMetrics, JobHistory
from lighthouse.coordinator.job_state import JobStateFile
from lighthouse.coordinator.lease import QuorumLease
from lighthouse.coordinator.quorum import (
    Decision,
    DecisionKind,
    QuorumConfig,
    QuorumState,
    decide_quorum,
)
from lighthouse.coordinator.stragglers import BusyWindows, Straggler, find_straggler
from lighthouse.types import (
    FailureNotice,
    HealReport,
    IntegrityReport,
    LeaseFloor,
    LeaseRecall,
    QuorumMember,
    QuorumWait,
)

log = logging.getLogger("lighthouse")


class Metrics(HistoryMetrics, Protocol):
    """What the core reports; ``lighthouse.coordinator.status.LighthouseMetrics`` implements it."""

    def quorum_issued(self, size: int, latency_s: float, new_id: bool) -> None: ...
    def death(self, cause: str, count: int) -> None: ...


class SupersededError(Exception):
    """A newer quorum request from the same replica replaced this one."""


class RefusedError(Exception):
    """The rules refused this request and no wait can change that (``Decision.final``);
    the message is the rules' reason."""


def _unix_ms() -> int:
    return int(time.time() * 1000)


class LighthouseCore:
    """Quorum state plus the futures and streams waiting on it (one event loop only)."""

    def __init__(
        self,
        config: QuorumConfig,
        clock: Clock,
        epoch: str,
        metrics: Metrics | None = None,
        job_state: JobStateFile | None = None,
    ) -> None:
        """``config`` times are in seconds; ``epoch`` is the random start-up id;
        ``job_state`` keeps the job's committed step across lighthouse restarts
        (read once here, written as it grows)."""
        self.config = config
        self.clock = clock
        self.epoch = epoch
        self.metrics = metrics
        self.job_state = job_state
        committed = recalled = 0
        ended = False
        if job_state is not None:
            job_state.epoch = epoch
            committed = job_state.load()
            recalled = job_state.quorum_members
            ended = job_state.run_ended
        self.state = QuorumState(epoch, committed, recalled, run_ended=ended)
        # a member of the latest quorum was declared dead since it was issued: the
        # run cannot end cleanly until a quorum without it is issued
        self._died_since_issue = False
        self.waiters: dict[str, asyncio.Future[bytes]] = {}
        # what each waiting asker was last told of its wait, and when (clock seconds)
        self._told_wait: dict[str, tuple[QuorumWait, float]] = {}
        self.streams: dict[str, set[asyncio.Queue[bytes]]] = {}
        # announced a clean shutdown on their liveness stream -> step committed through
        # replica id -> (the stream that announced a clean leave, committed-through step)
        self.leaving: dict[str, tuple[asyncio.Queue[bytes], int]] = {}
        self._last_imbalance_log = float("-inf")
        self.decision = Decision(
            None, "idle: no replica has asked for a quorum yet", DecisionKind.IDLE
        )
        self.recent_deaths: deque[dict[str, Any]] = deque(maxlen=64)
        self.recent_quarantines: deque[dict[str, Any]] = deque(maxlen=64)
        # integrity findings the replicas reported (silent data corruption), newest last
        self.recent_integrity_findings: deque[dict[str, Any]] = deque(maxlen=64)
        self.quorums_issued = 0
        self.lease = QuorumLease()
        self._last_wait_log = clock.now()
        # the dashboard's step samples and timeline (bounded ring buffers)
        self.history = JobHistory(metrics=metrics)
        self.history.started(epoch, committed, _unix_ms())
        # straggler detection: each replica's recent work per step (None: off)
        self.busy: BusyWindows | None = (
            BusyWindows(config.straggler_window) if config.straggler_window > 0 else None
        )
        self._last_straggler_check = float("-inf")
        self._last_tick: float | None = None  # when the previous tick ran
        self.last_straggler: Straggler | None = None  # the latest verdict, for /status

    # -- requests ----------------------------------------------------------------------
    def request(self, member: QuorumMember) -> asyncio.Future[bytes]:
        """Register a quorum request; the future gets the serialized response."""
        rid = member.replica_id
        old = self.waiters.pop(rid, None)
        if old is not None and not old.done():
            old.set_exception(
                SupersededError(f"a newer quorum request from {rid!r} replaced this one")
            )
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiters[rid] = fut
        now = self.clock.now()
        self.state.request(member, now)
        self.history.progress(rid, member.step, member.step_time_ms, now, _unix_ms(), member.heal)
        if member.integrity is not None:
            self._integrity_reported(rid, member.integrity, now)
        if self.busy is not None:
            self.busy.record(rid, member.step, member.busy_ms)
        self.lease.asked(rid)
        # A quarantined asker recalls the lease only if it holds one (an evicted
        # straggler): holders already in a leased round it will not join must fail it.
        if self.lease.holders and (
            not self.state.is_quarantined(rid, now) or rid in self.lease.members
        ):
            waiting = [p.member for p in self.state.pending.values()]
            self._send_recall(self.lease.recall_for_ask(self.epoch, waiting))
        self.evaluate()
        return fut

    def _integrity_reported(self, replica_id: str, report: IntegrityReport, now: float) -> None:
        """``replica_id`` reported an integrity finding with its request: recorded for
        ``/status``, the timeline and ``/metrics`` (once, however often it arrives);
        the rules then see its count (rule 10) when the request is evaluated."""
        if not self.state.integrity_reported(replica_id, report, now):
            return
        count = self.state.divergences.count(replica_id, now, self.config.divergence_window_s)
        unix_ms = _unix_ms()
        self.recent_integrity_findings.append(
            {
                "replica_id": replica_id,
                "kind": report.kind.value,
                "step": report.step,
                "tensors": list(report.tensors),
                "divergences_in_window": count,
                "unix_ms": unix_ms,
            }
        )
        self.history.integrity_reported(replica_id, report, count, unix_ms)
        log.warning(
            "replica %s reports silent data corruption at step %d: %s%s (its own divergences "
            "within %g s: %d)",
            replica_id,
            report.step,
            report.kind.value,
            f" in {', '.join(report.tensors)}" if report.tensors else "",
            self.config.divergence_window_s,
            count,
        )

    def quarantine_reason(self, replica_id: str) -> str | None:
        """Why ``replica_id`` is quarantined now, or None if it is not."""
        now = self.clock.now()
        if not self.state.is_quarantined(replica_id, now):
            return None
        q = self.state.quarantined[replica_id]
        return f"replica {replica_id!r} is quarantined for {q.until - now:.1f} s more (strike {q.strikes}): {q.reason}"

    def withdraw(self, replica_id: str, fut: asyncio.Future[bytes]) -> None:
        """The request behind ``fut`` was cancelled (deadline, client gone): forget it."""
        if self.waiters.get(replica_id) is fut:
            del self.waiters[replica_id]
            self.state.withdraw(replica_id)
            self.evaluate()  # keeps the reason shown on /status current

    def heartbeat(self, replica_id: str) -> None:
        """A sign of life from ``replica_id``."""
        self.state.heartbeat(replica_id, self.clock.now())

    def progress(
        self,
        replica_id: str,
        step: int,
        step_time_ms: float,
        heal: HealReport | None = None,
        busy_ms: float = 0.0,
        floor_wanted: int = 0,
    ) -> None:
        """A liveness ping: a sign of life and the step of the replica's latest round
        (``heal``: the replica's latest heal, if the ping reports one; ``busy_ms``:
        its last step's own work, for the straggler detector; ``floor_wanted``: a
        lease holder waits for the floor to reach this step, 0: it does not)."""
        now = self.clock.now()
        self.state.heartbeat(replica_id, now)
        self.state.report_progress(replica_id, step, step_time_ms, busy_ms)
        if self.busy is not None:
            self.busy.record(replica_id, step, busy_ms)
        self.history.progress(replica_id, step, step_time_ms, now, _unix_ms(), heal)
        self._send_floor(self.lease.progress(replica_id, step, now))
        if floor_wanted > 0:
            self._send_floor(self.lease.want(replica_id, floor_wanted), to=(replica_id,))
        self._persist(now)

    def _send_floor(self, floor: LeaseFloor | None, to: tuple[str, ...] | None = None) -> None:
        """Tell the lease holders waiting for it (or those ``to``) that every holder
        reached ``floor.step``."""
        if floor is None:
            return
        holders = self.lease.waiters(floor.step) if to is None else to
        if not holders:
            return
        payload = wire.encode_liveness_event(
            self.epoch, floor=LeaseFloor(self.epoch, floor.lease_id, floor.step)
        )
        for rid in holders:
            for q in self.streams.get(rid, ()):
                q.put_nowait(payload)

    def _quorum_members(self) -> int:
        """How many live members of a quorum last reached a step together, or the
        recalled size before any did in this epoch: a committed fact, so members
        that never report (a stranger taken into a quorum) never inflate it."""
        return self.state.commits.members or self.state.recalled_members

    def _persist(self, now: float) -> None:
        """Record the committed step and quorum size, both committed facts (throttled;
        ``tick`` writes what was held back)."""
        if self.job_state is not None:
            self.job_state.record(
                self.state.committed_step, now, self._quorum_members(), self.state.run_ended
            )

    def flush_job_state(self) -> None:
        """Write the committed step and the quorum size now (at shutdown; a failure
        is logged by ``JobStateFile``, never raised).

        The size matters as much as the step: the next lighthouse waits for a
        majority of it before issuing (rule 3); a record of 0 would let the
        first replica to reconnect commit a step alone while the others still
        run the old quorum's steps."""
        if self.job_state is not None:
            self.job_state.record(
                self.state.committed_step,
                quorum_members=self._quorum_members(),
                run_ended=self.state.run_ended,
            )
            self.job_state.flush()

    def _send_recall(self, recall: LeaseRecall | None) -> None:
        """Push ``recall`` to the lease holders on their liveness streams."""
        if recall is None:
            return
        payload = wire.encode_liveness_event(self.epoch, recall=recall)
        for rid in self.lease.holders:
            for q in self.streams.get(rid, ()):
                q.put_nowait(payload)
        log.info(
            "recalled lease %d of quorum %s/%d (absent %s, failing leased steps >= %d)",
            recall.lease_id,
            self.epoch,
            recall.quorum_id,
            list(recall.absent_replica_ids),
            recall.abort_from_step,
        )

    # -- liveness streams ----------------------------------------------------------------
    def stream_opened(self, replica_id: str, queue: asyncio.Queue[bytes]) -> None:
        """A manager server opened its liveness stream; notices go to ``queue``."""
        self.streams.setdefault(replica_id, set()).add(queue)
        self.heartbeat(replica_id)

    def replica_leaving(
        self, replica_id: str, queue: asyncio.Queue[bytes], committed_through: int = -1
    ) -> None:
        """``replica_id`` announced a clean shutdown on the stream of ``queue``: that
        stream closing is not a death. ``committed_through``: it committed every
        round below this step (-1: unknown).

        The mark belongs to that stream, not to the id: a leave announced on
        another stream under the same id (a stranger's, or a stale incarnation's)
        never hides the real stream's later death.
        """
        self.leaving[replica_id] = (queue, committed_through)

    def stream_closed(self, replica_id: str, queue: asyncio.Queue[bytes]) -> None:
        """The stream ended: with no other stream left, the replica is dead at once,
        or simply gone if it said it was leaving (no failure notice then)."""
        queues = self.streams.get(replica_id)
        if queues is None:
            return
        queues.discard(queue)
        leaving = self.leaving.get(replica_id)
        left_cleanly = leaving is not None and leaving[0] is queue
        if left_cleanly or (leaving is not None and leaving[0] not in queues):
            self.leaving.pop(replica_id)  # its announcing stream is gone either way
        if queues:
            return
        del self.streams[replica_id]
        self._told_wait.pop(replica_id, None)
        if left_cleanly:
            assert leaving is not None
            committed_through = leaving[1]
            recall, floor = self.lease.recall_for_leave(self.epoch, replica_id, committed_through)
            self._send_recall(recall)
            self._send_floor(floor)
            if self.state.forget(replica_id):
                log.info("replica %s left (clean shutdown)", replica_id)
                self.history.left(replica_id, _unix_ms())
                self._end_run_if_over()
                self.evaluate()
            return
        self.lease.asked(replica_id)  # dead: its peers hear it from the failure notice
        if self.state.forget(replica_id):
            self._declared_dead([replica_id], "liveness stream closed")

    def _end_run_if_over(self) -> None:
        """After a clean leave: if no replica is left and no member of the latest
        quorum died since it was issued, the run is over. Its committed step stays
        (a restart below it from a checkpoint is still refused), a new run from
        step 0 is admitted (rule 6), and the file says so at once, so a lighthouse
        restarted before the next run knows it too."""
        if (
            self.streams
            or self.state.seen
            or self.state.prev is None
            or self._died_since_issue
            or self.state.run_ended
        ):
            return
        self.state.end_run()
        step = self.state.committed_step
        log.info(
            "run ended cleanly at committed step %d: every replica left with a clean "
            "shutdown; a new run from step 0 will be admitted, a restart below step %d "
            "from a checkpoint will still be refused",
            step,
            step,
        )
        self.history.run_ended(step, _unix_ms())
        self.flush_job_state()

    def _refuse_pending(self, reason: str) -> None:
        """Fail every pending request with ``reason`` now: the decision is final, so
        holding the askers to their deadlines would only delay the same answer."""
        for rid, fut in list(self.waiters.items()):
            del self.waiters[rid]
            self.state.withdraw(rid)
            if not fut.done():
                fut.set_exception(RefusedError(reason))

    def _declared_dead(self, dead: list[str], reason: str) -> None:
        """Fail their pending requests, notify the survivors, re-decide."""
        for rid in dead:
            self._told_wait.pop(rid, None)
            self.lease.asked(rid)
            fut = self.waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(SupersededError(f"replica {rid!r} was declared dead: {reason}"))
        now_ms = _unix_ms()
        for rid in dead:
            self.recent_deaths.append({"replica_id": rid, "reason": reason, "unix_ms": now_ms})
        self.history.died(dead, reason, now_ms)
        if self.metrics is not None:
            self.metrics.death(reason, len(dead))
        prev = self.state.prev
        if prev is not None:
            members = set(prev.replica_ids)
            in_prev = tuple(r for r in dead if r in members)
            if in_prev:
                self._died_since_issue = True
                notice = FailureNotice(self.epoch, prev.quorum_id, in_prev, reason, now_ms)
                payload = wire.encode_liveness_event(self.epoch, notice)
                told = 0
                for rid in members.difference(in_prev):
                    queues = self.streams.get(rid, ())
                    told += bool(queues)
                    for q in queues:
                        q.put_nowait(payload)
                log.warning(
                    "replica(s) %s of quorum %s/%d died (%s); told %d survivor(s)",
                    list(in_prev),
                    self.epoch,
                    prev.quorum_id,
                    reason,
                    told,
                )
        self.evaluate()

    def tick_period(self, base_s: float) -> float:
        """Seconds from one tick to the next (see `tick_period_s`): ``base_s`` (the
        configured tick) while a replica asks or one is quarantined, longer while
        the lighthouse only watches leased steps and liveness."""
        return tick_period_s(
            base_s,
            self.config.heartbeat_timeout_s,
            self.config.join_timeout_s,
            busy=bool(self.state.pending or self.state.quarantined),
        )

    # -- deciding ------------------------------------------------------------------------
    def tick(self) -> None:
        """Periodic: expire silent replicas (heartbeat timeout fallback), re-decide.

        A tick that comes ``PAUSE_FRACTION`` of the heartbeat timeout (and at least
        ``MIN_PAUSE_S``, well above the ticks' period) or more after the previous
        one means the lighthouse itself did not run meanwhile (a
        SIGSTOP, a starved or suspended host): the replicas' pings wait unread in
        its sockets, so their silence is its own, and nobody is declared dead
        for it."""
        now = self.clock.now()
        last, self._last_tick = self._last_tick, now
        pause_s = max(PAUSE_FRACTION * self.config.heartbeat_timeout_s, MIN_PAUSE_S)
        paused = last is not None and now - last >= pause_s
        if paused:
            assert last is not None
            log.warning(
                "the lighthouse did not run for %.1f s (stopped or starved): every replica "
                "counts as alive now, and their pings sent meanwhile are read next",
                now - last,
            )
            self.state.forgive_silence(now)
            self.lease.forgive_silence(now)
        dead = self.state.prune(now, self.config.heartbeat_timeout_s)
        for rid in dead:
            for q in self.streams.pop(rid, ()):
                q.put_nowait(b"")  # ask its stream handler to hang up
        if dead:
            self._declared_dead(dead, f"no heartbeat for {self.config.heartbeat_timeout_s:g} s")
        else:
            self.evaluate()
        now = self.clock.now()
        self._check_stragglers(now)
        self._readmit(now)
        self._persist(now)
        self._send_recall(self.lease.recall_for_stall(self.epoch, now, self.config.join_timeout_s))
        self._tell_waiting(now)
        if (
            self.decision.members is None
            and self.state.pending
            and now - self._last_wait_log >= 5.0
        ):
            self._last_wait_log = now
            log.info("still waiting: %s", self.decision.reason)

    def _tell_waiting(self, now: float) -> None:
        """Tell each waiting asker why its quorum waits, on its liveness stream, when
        that changed: a new rule at once, new words of the same rule at most every
        ``WAIT_TELL_PERIOD_S`` seconds. O(pending) per tick."""
        d = self.decision
        for rid in self.state.pending:
            queues = self.streams.get(rid)
            if not queues:
                continue
            held = self.quarantine_reason(rid)
            if held is not None:
                wait = QuorumWait(kind=DecisionKind.QUARANTINE.value, reason=held)
            elif d.members is None and d.kind is not DecisionKind.IDLE:
                wait = QuorumWait(kind=d.kind.value, reason=d.reason)  # a plain string on the wire
            else:
                continue
            told = self._told_wait.get(rid)
            if told is not None and (
                told[0] == wait
                or (told[0].kind == wait.kind and now - told[1] < WAIT_TELL_PERIOD_S)
            ):
                continue
            self._told_wait[rid] = (wait, now)
            payload = wire.encode_liveness_event(self.epoch, waiting=wait)
            for q in queues:
                q.put_nowait(payload)

    def _log_step_times(self, quorum: Any, now: float) -> None:
        """The per-step report in the log: a warning (at most every 10 s) when the slowest
        replica's last step took IMBALANCE_WARN_RATIO x the median, else every 100 quorums."""
        report = step_time_report(
            [(m.step_time_ms, m.replica_id) for m in quorum.participants if m.step_time_ms > 0]
        )
        if report is None:
            return
        ratio = report["slowest_over_median"] or 0.0
        line = (
            f"step times in quorum {quorum.epoch}/{quorum.quorum_id}: median "
            f"{report['median_step_time_ms']:.1f} ms, slowest {report['slowest_replica_id']} "
            f"{report['slowest_step_time_ms']:.1f} ms ({ratio:.2f}x)"
        )
        if ratio >= IMBALANCE_WARN_RATIO and now - self._last_imbalance_log >= 10.0:
            self._last_imbalance_log = now
            log.warning("load imbalance: %s", line)
        elif self.quorums_issued % 100 == 0:
            log.info("%s", line)

    def _quarantine(self, replica_ids: tuple[str, ...], now: float, reason: str) -> None:
        """Quarantine ``replica_ids`` for ``reason``: the state, /status, the timeline, the log."""
        self.state.quarantine(replica_ids, now, self.config, reason)
        for rid in replica_ids:
            q = self.state.quarantined[rid]
            self.recent_quarantines.append(
                {
                    "replica_id": rid,
                    "seconds": round(q.until - now, 3),
                    "strikes": q.strikes,
                    "reason": q.reason,
                    "unix_ms": _unix_ms(),
                }
            )
            self.history.quarantined(rid, q.until - now, q.strikes, q.reason, _unix_ms())
            log.warning(
                "quarantined replica %s for %.1f s (strike %d): %s",
                rid,
                q.until - now,
                q.strikes,
                reason,
            )

    def _check_stragglers(self, now: float) -> None:
        """At most every ``STRAGGLER_CHECK_PERIOD_S``: quarantine the current quorum's
        straggler, if the detector finds one (``coordinator.stragglers``), and recall
        the lease so the others ask again and form a quorum without it. O(members)."""
        busy = self.busy
        prev = self.state.prev
        if (
            busy is None
            or prev is None
            or now - self._last_straggler_check < STRAGGLER_CHECK_PERIOD_S
        ):
            return
        self._last_straggler_check = now
        for rid in busy.known():
            if rid not in self.state.seen:
                busy.forget(rid)  # dead or left
        members = [
            m.replica_id
            for m in prev.participants
            if m.replica_id in self.state.seen and not self.state.is_quarantined(m.replica_id, now)
        ]
        medians = busy.medians(members)
        if medians is None:
            return
        verdict = find_straggler(
            medians,
            slowdown=self.config.straggler_slowdown,
            min_replicas=self.config.min_replicas,
            steps=busy.window,
        )
        if verdict is None:
            return
        self.last_straggler = verdict
        busy.reset(verdict.replica_id)  # judged again only on a whole new window
        self._quarantine((verdict.replica_id,), now, verdict.reason())
        # Nobody asks while the quorum runs on a lease: void it, failing no step (the
        # straggler's own ask, held, then fails any leased round it will not join).
        self._send_recall(self.lease.recall_all(self.epoch))
        self.evaluate()

    def _readmit(self, now: float) -> None:
        """A waiting replica whose quarantine ended is a joiner: recall the others'
        lease so they ask again and a quorum can take it in (sent once per lease)."""
        if not self.lease.holders or not self.state.quarantined:
            return
        waiting = [
            p.member
            for rid, p in self.state.pending.items()
            if rid in self.state.quarantined and not self.state.is_quarantined(rid, now)
        ]
        if waiting:
            self._send_recall(self.lease.recall_for_ask(self.epoch, waiting))

    def evaluate(self) -> None:
        """Run the rules once; issue and deliver a quorum if they say so."""
        now = self.clock.now()
        d = decide_quorum(now, self.state, self.config)
        if d.quarantine:
            self._quarantine(d.quarantine, now, d.reason)
            d = decide_quorum(now, self.state, self.config)  # without them
        if d.kind is not self.decision.kind:
            quiet = d.kind in (DecisionKind.FAST, DecisionKind.IDLE)
            level = logging.DEBUG if quiet else logging.INFO
            if d.kind is DecisionKind.BELOW_COMMITTED:
                level = logging.WARNING
            log.log(level, "%s", d.reason)
        self.decision = d
        if d.members is None:
            if d.final:
                self._refuse_pending(d.reason)
            self._persist(now)
            return
        top = max(m.step for m in d.members)
        if self.state.run_ended:
            log.info(
                "new run from step %d: the previous run ended cleanly at committed step %d",
                top,
                self.state.committed_step,
            )
        elif top < self.state.committed_step:
            log.warning(
                "job reset from committed step %d to step %d: allowed by allow_step_reset",
                self.state.committed_step,
                top,
            )
        latency_s = now - self.state.earliest_joined(now)
        old_id = self.state.quorum_id
        previous = self.state.prev
        created_ms = _unix_ms()
        quorum = self.state.issue(d.members, now, created_ms)
        for m in d.members:
            self._told_wait.pop(m.replica_id, None)
        self._died_since_issue = False
        if quorum.quorum_id != old_id:
            self.history.quorum_issued(quorum, previous, d.reason, now, created_ms)
        self.quorums_issued += 1
        self._log_step_times(quorum, now)
        # holders still on the lease were left out at the join timeout: their peers moved on
        self._send_recall(self.lease.recall_excluded(self.epoch))
        lease_id = 0
        if self.config.lease and not self.state.asking(now):
            lease_id = self.quorums_issued
            self.lease.grant(lease_id, quorum, now)
        else:
            self.lease.clear()
        payload = wire.encode_lighthouse_quorum_response(quorum, lease_id)
        for m in d.members:
            fut = self.waiters.pop(m.replica_id, None)
            if fut is not None and not fut.done():
                fut.set_result(payload)
        self._persist(now)
        if self.metrics is not None:
            self.metrics.quorum_issued(len(d.members), latency_s, quorum.quorum_id != old_id)
        if quorum.quorum_id != old_id:
            log.info(
                "quorum %s/%d issued with %d member(s): %s",
                self.epoch,
                quorum.quorum_id,
                len(d.members),
                d.reason,
            )

    # -- status --------------------------------------------------------------------------
    def _straggler_report(self) -> dict[str, Any]:
        """The detector's settings, each replica's median work per step over a full
        window (ms), and its latest verdict, for ``/status`` and the dashboard."""
        busy = self.busy
        medians: dict[str, float] = {}
        if busy is not None:
            for rid in busy.known():
                m = busy.median(rid)
                if m is not None:
                    medians[rid] = round(m, 3)
        last = self.last_straggler
        return {
            "enabled": busy is not None,
            "window_steps": self.config.straggler_window,
            "slowdown": self.config.straggler_slowdown,
            "median_busy_ms": medians,
            "job_busy_ms": round(statistics.median(medians.values()), 3) if medians else None,
            "last_verdict": None
            if last is None
            else {
                "replica_id": last.replica_id,
                "busy_ms": round(last.busy_ms, 3),
                "others_ms": round(last.others_ms, 3),
                "slowdown": round(last.slowdown, 3),
                "reason": last.reason(),
            },
        }

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able picture for ``/status`` (O(N); called on demand only)."""
        now = self.clock.now()
        state = self.state
        prev = state.prev
        members: list[dict[str, Any]] = []
        step_times: list[tuple[float, str]] = []
        if prev is not None:
            max_step = max((m.step for m in prev.participants), default=0)
            for m in prev.participants:
                d = asdict(m)
                last = state.seen.get(m.replica_id)
                d["alive"] = last is not None
                d["last_seen_s_ago"] = None if last is None else round(now - last, 3)
                d["recovering"] = m.step != max_step
                latest = state.last_member.get(m.replica_id)
                d["latest_step"] = m.step if latest is None else max(m.step, latest.step)
                if latest is not None and latest.step_time_ms > 0:
                    d["step_time_ms"] = latest.step_time_ms
                    step_times.append((latest.step_time_ms, m.replica_id))
                members.append(d)
        step_report = step_time_report(step_times)
        live = [
            {
                "replica_id": rid,
                "last_seen_s_ago": round(now - last, 3),
                "pending": rid in state.pending,
                "liveness_streams": len(self.streams.get(rid, ())),
            }
            for rid, last in state.seen.items()
        ]
        waiting = set(state.seen) - set(state.pending)
        now_ms = _unix_ms()
        history = self.history.to_json(now, now_ms)  # first: drops samples past the window
        health = replica_health(
            state=state,
            now=now,
            heartbeat_timeout_s=self.config.heartbeat_timeout_s,
            streams={rid: len(qs) for rid, qs in self.streams.items()},
            steps=self.history.steps,
            gone=self.history.gone_reason,
        )
        return {
            "epoch": self.epoch,
            "started_unix_ms": self.history.started_unix_ms,
            "quorum_id": state.quorum_id,
            "quorums_issued": self.quorums_issued,
            "committed_step": state.committed_step,
            "run_ended": state.run_ended,
            "job_state_file": None if self.job_state is None else str(self.job_state.path),
            "job_state_error": None if self.job_state is None else self.job_state.error,
            "quorum": None
            if prev is None
            else {
                "quorum_id": prev.quorum_id,
                "epoch": prev.epoch,
                "created_unix_ms": prev.created_unix_ms,
                "age_s": round(time.time() - prev.created_unix_ms / 1000, 3),
                "members": members,
            },
            "next_quorum": {
                "reason": self.decision.reason,
                "kind": self.decision.kind.value,
                "pending": sorted(state.pending),
                "not_asked_yet": sorted(waiting)[:100],
            },
            "live": live[:1000],
            "live_count": len(live),
            "recent_deaths": list(self.recent_deaths),
            "quarantined": [
                {
                    "replica_id": rid,
                    "remaining_s": round(q.until - now, 3),
                    "strikes": q.strikes,
                    "reason": q.reason,
                }
                for rid, q in state.quarantined.items()
                if q.until > now
            ],
            "recent_quarantines": list(self.recent_quarantines),
            "recent_integrity_findings": list(self.recent_integrity_findings),
            "step_report": step_report,
            "stragglers": self._straggler_report(),
            "config": asdict(self.config),
            "health": [row.to_json() for row in health],
            "history": history,
        }


STRAGGLER_CHECK_PERIOD_S = 1.0  # how often the straggler detector runs (on the tick)
# A gap between two ticks of this fraction of the heartbeat timeout means the
# lighthouse was not running (ticks come every 100 ms by default).
PAUSE_FRACTION = 0.5
MIN_PAUSE_S = 1.0  # ... and at least this long: ten default tick periods (seconds)
IDLE_TICK_S = 0.5  # the longest gap between ticks while nothing waits on time (seconds)
IMBALANCE_WARN_RATIO = 1.5  # slowest step time over the median that is worth a warning
WAIT_TELL_PERIOD_S = 2.0  # a waiting asker hears new words of the same rule at most this often


def step_time_report(step_times: list[tuple[float, str]]) -> dict[str, Any] | None:
    """Median and slowest of (step time ms, replica id) pairs; None without data."""
    if not step_times:
        return None
    median = statistics.median(t for t, _ in step_times)
    slow_t, slow_id = max(step_times)
    return {
        "median_step_time_ms": median,
        "slowest_replica_id": slow_id,
        "slowest_step_time_ms": slow_t,
        "slowest_over_median": round(slow_t / median, 3) if median > 0 else None,
    }


def tick_period_s(
    base_s: float, heartbeat_timeout_s: float, join_timeout_s: float, *, busy: bool
) -> float:
    """Seconds between two ticks: ``base_s`` while anything waits on the clock
    (``busy``: a replica asks, whose join timeout and wait reasons the tick
    serves, or one is quarantined); otherwise at most ``IDLE_TICK_S``, a tenth of
    the heartbeat timeout and a quarter of the join timeout, and never less than
    ``base_s``.

    An idle tick still declares a silent replica dead (at most a tenth of the
    timeout late) and recalls a stalled lease holder (whose patience is at least
    the join timeout, so at most a quarter of it late). What it saves is the
    wake-up itself: an event loop's timer wake-up costs 160-230 µs of CPU on a
    2-core VM, so ten a second are most of an idle lighthouse's CPU. With
    torchft's timing (join timeout 100 ms) the bound is below the default tick,
    and the tick stays ``base_s``.
    """
    if busy:
        return base_s
    return max(base_s, min(IDLE_TICK_S, heartbeat_timeout_s / 10, join_timeout_s / 4))
