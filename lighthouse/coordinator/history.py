"""The lighthouse's recent past, for the dashboard: step samples and a timeline.

Two bounded ring buffers and the recorder that fills them from the core's events:

* ``StepHistory``: per replica, at most one ``(time, step, reported step time)``
  sample every ``sample_interval_s`` seconds over the last ``window_s`` seconds,
  for at most ``max_replicas`` replicas (the longest-silent one is dropped
  first). Step rates and, where a replica reports none, step times are derived
  from consecutive samples when a snapshot is taken, so recording stays O(1)
  on the event loop's hot path (one liveness ping per round per replica).
* ``Timeline``: the last ``capacity`` events: the lighthouse's start (a new
  epoch), quorum changes with who joined and left, deaths, clean leaves,
  heals, catch-ups, integrity findings (silent data corruption a replica
  reported) and quarantines.
* ``JobHistory``: what the core calls when something happens; it keeps both
  buffers and reports the matching Prometheus numbers.

Heals as the lighthouse sees them: a member entering a quorum behind the
quorum's highest step heals from a peer, so it is recorded as a heal; later
that member reports the target step (recorded as caught up, with the seconds
since the quorum: the heal plus the first step after it). The transfer itself
runs between the healer and its source; the healer measures it (bytes
received, transfer seconds) and reports a ``HealReport`` once, with its next
quorum request and liveness ping, which also carry the step that makes it
caught up. So the caught-up event carries the heal's bytes, seconds and GB/s.
A report for a heal the lighthouse did not see as one (an ``init_sync`` heal at
step 0, where nobody is behind, or one from before a lighthouse restart) gets
a heal event of its own. The same report arriving twice (request and ping of
one round) is recorded once.

Everything here takes ``now`` (the lighthouse clock, seconds) and ``unix_ms``
(wall clock, milliseconds) from the caller and reads no clock itself. Like the
core, it belongs to the lighthouse's event loop; ``/status`` gets JSON-able
copies built there, so nothing is shared across threads.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from lighthouse.types import HealReport, IntegrityKind, IntegrityReport, Quorum

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "DEFAULT_TIMELINE_CAPACITY",
    "DEFAULT_WINDOW_S",
    "EventKind",
    "HistoryMetrics",
    "JobHistory",
    "ReplicaSeries",
    "StepHistory",
    "StepSample",
    "Timeline",
    "TimelineEvent",
    "format_bytes",
    "heal_figures",
]

DEFAULT_WINDOW_S = 300.0  # step samples kept per replica: the last 5 minutes
DEFAULT_SAMPLE_INTERVAL_S = 2.0  # at most one step sample per replica every 2 s
DEFAULT_MAX_REPLICAS = 256  # replicas with step samples (incarnations count separately)
DEFAULT_TIMELINE_CAPACITY = 500  # timeline events kept
RECENT_RATE_SPAN_S = 10.0  # "current" step rate: over about the last 10 s
_GONE_CAPACITY = 1024  # how many departed replica ids remember why they left
_HEALS_SHOWN = 64  # /status ``heals``: the latest reports, one per replica, newest first


@dataclass(frozen=True, kw_only=True)
class StepSample:
    """A replica at ``step`` at clock time ``t`` (seconds); ``step_time_ms`` is its
    reported last step duration in milliseconds (0 = not reported). ``jump``: the
    step got here by a heal, not by training, so no rate spans the gap before it."""

    t: float
    step: int
    step_time_ms: float
    jump: bool = False


@dataclass(frozen=True, kw_only=True)
class ReplicaSeries:
    """One replica's samples over the window, oldest first, as parallel columns.

    ``age_s``: seconds before the snapshot. ``steps_per_s``: the rate since the
    previous sample (None for the first, after a heal's jump, or after the step
    went down: a new incarnation reusing the id). ``step_time_ms``: the reported
    values if the replica reported any in the window (None where a sample has
    none), else derived from the interval (seconds per step since the previous
    sample); ``step_time_reported`` says which.
    """

    replica_id: str
    age_s: tuple[float, ...]
    step: tuple[int, ...]
    steps_per_s: tuple[float | None, ...]
    step_time_ms: tuple[float | None, ...]
    step_time_reported: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "age_s": list(self.age_s),
            "step": list(self.step),
            "steps_per_s": list(self.steps_per_s),
            "step_time_ms": list(self.step_time_ms),
            "step_time_reported": self.step_time_reported,
        }


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


class StepHistory:
    """Per-replica step samples: a ring buffer each, over the last ``window_s`` seconds."""

    def __init__(
        self,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
        max_replicas: int = DEFAULT_MAX_REPLICAS,
    ) -> None:
        """``window_s``: how far back samples are kept (seconds); ``sample_interval_s``:
        the least time between two kept samples of one replica (seconds);
        ``max_replicas``: replicas with samples at most (the one silent longest goes)."""
        _check_positive("window_s", window_s)
        _check_positive("sample_interval_s", sample_interval_s)
        if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
            raise ValueError(f"max_replicas must be an int >= 1, got {max_replicas!r}")
        self.window_s = float(window_s)
        self.sample_interval_s = float(sample_interval_s)
        self.max_replicas = max_replicas
        self._per_replica = math.ceil(window_s / sample_interval_s) + 1
        # Least recently recorded first: the replica silent longest is the first key,
        # so making room for a new one is O(1) however many are tracked.
        self._samples: OrderedDict[str, deque[StepSample]] = OrderedDict()

    def record(
        self, replica_id: str, step: int, step_time_ms: float, now: float, jump: bool = False
    ) -> bool:
        """Note that ``replica_id`` is at ``step`` at ``now`` (seconds). True if kept
        as a sample: the first one, one ``sample_interval_s`` after the last kept,
        a step below the last (a reset starts a new segment at once), or a
        ``jump`` (a heal: kept at once, so no rate spans it)."""
        samples = self._samples
        buf = samples.get(replica_id)
        if buf is None:
            if len(samples) >= self.max_replicas:
                samples.popitem(last=False)  # the one silent longest
            buf = samples[replica_id] = deque(maxlen=self._per_replica)
        else:
            samples.move_to_end(replica_id)  # heard from now, kept as a sample or not
            if now - buf[-1].t < self.sample_interval_s and step >= buf[-1].step and not jump:
                return False
        buf.append(StepSample(t=now, step=step, step_time_ms=max(0.0, step_time_ms), jump=jump))
        return True

    def latest(self, replica_id: str) -> StepSample | None:
        """The newest kept sample of ``replica_id``, or None."""
        buf = self._samples.get(replica_id)
        return buf[-1] if buf else None

    def last_reported_ms(self, replica_id: str) -> float | None:
        """The newest step time ``replica_id`` reported in the window (ms), or None."""
        for s in reversed(self._samples.get(replica_id, ())):
            if s.step_time_ms > 0:
                return s.step_time_ms
        return None

    def recent_rate(
        self, replica_id: str, now: float, span_s: float = RECENT_RATE_SPAN_S
    ) -> float | None:
        """Steps per second between the newest sample and the oldest one at most
        ``span_s`` seconds older; 0 if the newest is older than ``span_s`` (the
        replica stopped reporting progress); None with fewer than two samples."""
        buf = self._samples.get(replica_id)
        if not buf or len(buf) < 2:
            return None
        last = buf[-1]
        if now - last.t > span_s:
            return 0.0
        first = last
        for s in reversed(buf):
            if last.t - s.t > span_s or s.step > last.step:
                break
            first = s
            if s.jump:
                break  # no rate across a heal
        dt = last.t - first.t
        if dt <= 0:
            return None
        return (last.step - first.step) / dt

    def series(self, now: float) -> list[ReplicaSeries]:
        """Every replica's samples within the window at ``now`` (older ones are
        dropped here), sorted by replica id; replicas with none left are forgotten."""
        horizon = now - self.window_s
        out = []
        for rid in sorted(self._samples):
            buf = self._samples[rid]
            while buf and buf[0].t < horizon:
                buf.popleft()
            if not buf:
                del self._samples[rid]
                continue
            out.append(_series(rid, buf, now))
        return out

    def replica_ids(self) -> list[str]:
        """Replicas with samples (some may be older than the window until ``series``)."""
        return list(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


def _series(replica_id: str, samples: Iterable[StepSample], now: float) -> ReplicaSeries:
    samples = list(samples)
    reported = any(s.step_time_ms > 0 for s in samples)
    ages: list[float] = []
    steps: list[int] = []
    rates: list[float | None] = []
    times: list[float | None] = []
    prev: StepSample | None = None
    for s in samples:
        ages.append(round(now - s.t, 2))
        steps.append(s.step)
        rate: float | None = None
        derived: float | None = None
        if prev is not None and not s.jump and s.t > prev.t and s.step >= prev.step:
            rate = round((s.step - prev.step) / (s.t - prev.t), 3)
            if s.step > prev.step:
                derived = round((s.t - prev.t) * 1000 / (s.step - prev.step), 3)
        rates.append(rate)
        if reported:
            times.append(round(s.step_time_ms, 3) if s.step_time_ms > 0 else None)
        else:
            times.append(derived)
        prev = s
    return ReplicaSeries(
        replica_id=replica_id,
        age_s=tuple(ages),
        step=tuple(steps),
        steps_per_s=tuple(rates),
        step_time_ms=tuple(times),
        step_time_reported=reported,
    )


class EventKind(str, Enum):
    """What a timeline event records (its ``kind`` in ``/status``)."""

    STARTED = "started"  # this lighthouse started: a new epoch
    QUORUM = "quorum"  # a quorum with a new id: who joined, who left
    DEATH = "death"  # replicas declared dead (stream closed, or heartbeat timeout)
    LEFT = "left"  # a replica shut down cleanly
    HEAL = "heal"  # members entered a quorum behind its highest step (or one reported a heal)
    CAUGHT_UP = "caught_up"  # a healing member reported the quorum's step
    QUARANTINE = "quarantine"  # a replica left out of quorums for a while
    INTEGRITY = "integrity"  # a replica reported silent data corruption (IntegrityReport)
    RUN_ENDED = "run_ended"  # every member of the last quorum left cleanly: the run is over


@dataclass(frozen=True, kw_only=True)
class TimelineEvent:
    """One thing that happened, at wall time ``unix_ms`` (milliseconds).

    ``text`` says it in one line; the other fields carry its numbers, those that
    do not apply are empty (or None): ``replica_ids`` the replicas concerned
    (the dead, the healers, ...), ``joined``/``left`` a quorum's membership
    changes, ``quorum_id``/``size`` the quorum, ``step`` the step involved (the
    quorum's highest, a heal's target, a restored committed step), ``seconds``
    a duration (a catch-up's, a quarantine's length). ``heal_bytes``,
    ``heal_s`` and ``heal_gb_per_s``: what the replica's heal moved as it
    reported it (bytes received, transfer seconds, 10**9 bytes per second;
    None where no report came), on ``caught_up`` events and reported heals.
    ``integrity_kind`` (an ``IntegrityKind`` value) and ``tensors`` (the first
    differing tensors' names): what an ``integrity`` event's replica found.
    """

    kind: EventKind
    unix_ms: int
    text: str
    replica_ids: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    quorum_id: int | None = None
    size: int | None = None
    step: int | None = None
    seconds: float | None = None
    heal_bytes: int | None = None
    heal_s: float | None = None
    heal_gb_per_s: float | None = None
    integrity_kind: str | None = None
    tensors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "unix_ms": self.unix_ms,
            "text": self.text,
            "replica_ids": list(self.replica_ids),
            "joined": list(self.joined),
            "left": list(self.left),
            "quorum_id": self.quorum_id,
            "size": self.size,
            "step": self.step,
            "seconds": self.seconds,
            "heal_bytes": self.heal_bytes,
            "heal_s": self.heal_s,
            "heal_gb_per_s": self.heal_gb_per_s,
            "integrity_kind": self.integrity_kind,
            "tensors": list(self.tensors),
        }


def format_bytes(n: int) -> str:
    """``n`` bytes with a decimal unit and three significant digits: "12.3 MB"."""
    units = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
    value, i = float(n), 0
    # compare the rounded value, so 999,999 bytes read "1 MB", not "1e+03 kB"
    while i < len(units) - 1 and abs(float(f"{value:.3g}")) >= 1000:
        value /= 1000
        i += 1
    return f"{n} B" if i == 0 else f"{value:.3g} {units[i]}"


def heal_figures(heal: HealReport) -> str:
    """A heal report in words: "12.3 MB in 0.42 s (29.3 GB/s)"."""
    rate = heal.gb_per_s
    speed = "" if rate is None else f" ({rate:.3g} GB/s)"
    return f"{format_bytes(heal.bytes_received)} in {heal.transfer_s:.3g} s{speed}"


def _heal_fields(heal: HealReport | None) -> dict[str, Any]:
    """A ``TimelineEvent``'s heal fields for ``heal``, as reported (not rounded:
    a slow link's GB/s is a small number)."""
    if heal is None:
        return {}
    return {
        "heal_bytes": heal.bytes_received,
        "heal_s": heal.transfer_s,
        "heal_gb_per_s": heal.gb_per_s,
    }


class Timeline:
    """The last ``capacity`` events, oldest first."""

    def __init__(self, capacity: int = DEFAULT_TIMELINE_CAPACITY) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self._events: deque[TimelineEvent] = deque(maxlen=capacity)
        self.total = 0  # events ever added, including those the ring dropped

    def add(self, event: TimelineEvent) -> None:
        self._events.append(event)
        self.total += 1

    def events(self) -> list[TimelineEvent]:
        return list(self._events)


class HistoryMetrics(Protocol):
    """The Prometheus side of ``JobHistory`` (``status.LighthouseMetrics``)."""

    def replica_progress(self, replica_id: str, step: int, step_time_ms: float) -> None: ...
    def replica_gone(self, replica_id: str) -> None: ...
    def heals(self, count: int) -> None: ...
    def caught_up(self, seconds: float) -> None: ...
    def heal_reported(self, replica_id: str, nbytes: int, seconds: float) -> None: ...
    def quarantined(self, count: int) -> None: ...
    def integrity_reported(self, kind: str) -> None: ...


def _names(ids: Iterable[str], limit: int = 8) -> str:
    ids = list(ids)
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


class JobHistory:
    """Records the core's events into a ``StepHistory`` and a ``Timeline``."""

    def __init__(
        self,
        *,
        steps: StepHistory | None = None,
        timeline: Timeline | None = None,
        metrics: HistoryMetrics | None = None,
    ) -> None:
        self.steps = steps if steps is not None else StepHistory()
        self.timeline = timeline if timeline is not None else Timeline()
        self.metrics = metrics
        self.started_unix_ms = 0
        # healing member -> (the step it must reach, clock seconds when its quorum issued)
        self._healing: dict[str, tuple[int, float]] = {}
        # departed replica -> DEATH or LEFT, newest last, bounded
        self._gone: OrderedDict[str, EventKind] = OrderedDict()
        # healing member -> its heal report, shown on its caught-up event
        self._heal_reports: dict[str, HealReport] = {}
        # replica -> (its latest heal report, wall ms when it came), newest last, bounded:
        # recognizes the same report arriving again, and is /status's ``heals``
        self._last_heal: OrderedDict[str, tuple[HealReport, int]] = OrderedDict()
        self.heals_reported = 0  # heal reports recorded since start
        self.heal_bytes_total = 0  # bytes those heals received, in all
        self.integrity_findings = 0  # integrity findings recorded since start

    def started(self, epoch: str, committed_step: int, unix_ms: int) -> None:
        """This lighthouse started with epoch ``epoch``; ``committed_step`` > 0 was
        restored from its state file (a restart of the job's lighthouse)."""
        self.started_unix_ms = unix_ms
        text = f"lighthouse started, epoch {epoch}"
        if committed_step > 0:
            text += f"; the job's committed step {committed_step} restored from the state file"
        self.timeline.add(
            TimelineEvent(kind=EventKind.STARTED, unix_ms=unix_ms, text=text, step=committed_step)
        )

    def progress(
        self,
        replica_id: str,
        step: int,
        step_time_ms: float,
        now: float,
        unix_ms: int,
        heal: HealReport | None = None,
    ) -> None:
        """``replica_id`` asked, or pinged, at ``step`` (``now``: clock seconds);
        ``heal``: the heal it reports with this request or ping, if any."""
        if heal is not None:
            self._heal_reported(replica_id, heal, unix_ms)
        healing = self._healing.get(replica_id)
        caught_up = healing is not None and step >= healing[0]
        kept = self.steps.record(replica_id, step, step_time_ms, now, jump=caught_up)
        if kept and self.metrics is not None:
            self.metrics.replica_progress(replica_id, step, step_time_ms)
        if healing is not None and caught_up:
            del self._healing[replica_id]
            report = self._heal_reports.pop(replica_id, None)
            seconds = round(now - healing[1], 3)
            text = f"{replica_id} caught up to step {healing[0]}, {seconds:g} s after its quorum"
            if report is not None:
                text += f"; its heal received {heal_figures(report)}"
            self.timeline.add(
                TimelineEvent(
                    kind=EventKind.CAUGHT_UP,
                    unix_ms=unix_ms,
                    text=text,
                    replica_ids=(replica_id,),
                    step=healing[0],
                    seconds=seconds,
                    **_heal_fields(report),
                )
            )
            if self.metrics is not None:
                self.metrics.caught_up(seconds)

    def quorum_issued(
        self, quorum: Quorum, previous: Quorum | None, reason: str, now: float, unix_ms: int
    ) -> None:
        """A quorum with a new id issued (``previous``: the one before it, if any)."""
        ids = quorum.replica_ids
        before = set() if previous is None else set(previous.replica_ids)
        joined = tuple(r for r in ids if r not in before)
        left = tuple(sorted(before.difference(ids)))
        top = max((m.step for m in quorum.participants), default=0)
        parts = [f"quorum {quorum.quorum_id}: {len(ids)} member(s) at step {top}"]
        if joined:
            parts.append(f"joined {_names(joined)}")
        if left:
            parts.append(f"left {_names(left)}")
        if previous is not None and not joined and not left:
            parts.append("same members, new id after failed commits")
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.QUORUM,
                unix_ms=unix_ms,
                text="; ".join(parts) + f" ({reason})",
                joined=joined,
                left=left,
                quorum_id=quorum.quorum_id,
                size=len(ids),
                step=top,
            )
        )
        behind = tuple(m.replica_id for m in quorum.participants if m.step < top)
        for m in quorum.participants:
            if m.step >= top:  # at the top now: an earlier heal's target is moot
                self._healing.pop(m.replica_id, None)  # (one to a claimed step 2**62, say)
                self._heal_reports.pop(m.replica_id, None)
        if not behind:
            return
        for rid in behind:
            self._healing[rid] = (top, now)
            self._heal_reports.pop(rid, None)  # an earlier attempt's: this heal reports anew
        lowest = min(m.step for m in quorum.participants)
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.HEAL,
                unix_ms=unix_ms,
                text=(
                    f"{len(behind)} member(s) heal to step {top} (from step {lowest}"
                    f"{'' if len(behind) == 1 else ' or later'}): {_names(behind)}"
                ),
                replica_ids=behind,
                quorum_id=quorum.quorum_id,
                step=top,
            )
        )
        if self.metrics is not None:
            self.metrics.heals(len(behind))

    def _heal_reported(self, replica_id: str, heal: HealReport, unix_ms: int) -> None:
        """Record ``replica_id``'s heal report, unless it is the one already recorded."""
        last = self._last_heal.get(replica_id)
        if last is not None and last[0] == heal:
            return  # the same report again (the request and the ping of one round)
        self._last_heal[replica_id] = (heal, unix_ms)
        self._last_heal.move_to_end(replica_id)
        while len(self._last_heal) > _GONE_CAPACITY:
            self._last_heal.popitem(last=False)
        self.heals_reported += 1
        self.heal_bytes_total += heal.bytes_received
        if self.metrics is not None:
            self.metrics.heal_reported(replica_id, heal.bytes_received, heal.transfer_s)
        if replica_id in self._healing:
            self._heal_reports[replica_id] = heal  # shown when it catches up
            return
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.HEAL,
                unix_ms=unix_ms,
                text=f"{replica_id} healed to step {heal.step}: received {heal_figures(heal)}",
                replica_ids=(replica_id,),
                step=heal.step,
                seconds=round(heal.transfer_s, 3),
                **_heal_fields(heal),
            )
        )

    def died(self, replica_ids: Iterable[str], reason: str, unix_ms: int) -> None:
        """``replica_ids`` were declared dead because of ``reason``."""
        dead = tuple(replica_ids)
        for rid in dead:
            self._gone_now(rid, EventKind.DEATH)
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.DEATH,
                unix_ms=unix_ms,
                text=f"{_names(dead)} declared dead: {reason}",
                replica_ids=dead,
            )
        )

    def left(self, replica_id: str, unix_ms: int) -> None:
        """``replica_id`` shut down cleanly (announced on its liveness stream)."""
        self._gone_now(replica_id, EventKind.LEFT)
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.LEFT,
                unix_ms=unix_ms,
                text=f"{replica_id} left (clean shutdown)",
                replica_ids=(replica_id,),
            )
        )

    def run_ended(self, step: int, unix_ms: int) -> None:
        """The run ended cleanly at committed step ``step``."""
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.RUN_ENDED,
                unix_ms=unix_ms,
                text=f"run ended cleanly at committed step {step}: a new run from step 0 is "
                "admitted, a restart below it from a checkpoint is still refused",
                step=step,
            )
        )

    def quarantined(
        self, replica_id: str, seconds: float, strikes: int, reason: str, unix_ms: int
    ) -> None:
        """``replica_id`` sits out of quorums for ``seconds`` (its ``strikes``-th time)."""
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.QUARANTINE,
                unix_ms=unix_ms,
                text=f"{replica_id} quarantined for {seconds:g} s (strike {strikes}): {reason}",
                replica_ids=(replica_id,),
                seconds=round(seconds, 3),
            )
        )
        if self.metrics is not None:
            self.metrics.quarantined(1)

    def integrity_reported(
        self, replica_id: str, report: IntegrityReport, count: int, unix_ms: int
    ) -> None:
        """``replica_id`` reported an integrity finding; ``count``: its own divergences
        the lighthouse counts toward quarantine now (rule 10)."""
        self.integrity_findings += 1
        what = {
            IntegrityKind.DIVERGED: "its state diverged from the majority's",
            IntegrityKind.HEAL_SOURCE_DIVERGED: "its heal source's state diverged from the "
            "majority's (the healed state was dropped)",
            IntegrityKind.NO_MAJORITY: "the replicas' states differ and no majority holds one "
            "(no step commits)",
            IntegrityKind.GRADIENT_DIVERGED: "the averaged gradient it received differed from "
            "the majority's (a corrupt reduction: the step was discarded)",
        }[report.kind]
        text = f"{replica_id}: silent data corruption at step {report.step}: {what}"
        if report.tensors:
            text += f", in {_names(report.tensors, limit=3)}"
        if report.kind is IntegrityKind.DIVERGED:
            text += f" ({count} time(s) in the counting window)"
        self.timeline.add(
            TimelineEvent(
                kind=EventKind.INTEGRITY,
                unix_ms=unix_ms,
                text=text,
                replica_ids=(replica_id,),
                step=report.step,
                integrity_kind=report.kind.value,
                tensors=report.tensors,
            )
        )
        if self.metrics is not None:
            self.metrics.integrity_reported(report.kind.value)

    def gone_reason(self, replica_id: str) -> EventKind | None:
        """DEATH or LEFT if ``replica_id`` departed recently, else None."""
        return self._gone.get(replica_id)

    def _gone_now(self, replica_id: str, kind: EventKind) -> None:
        self._healing.pop(replica_id, None)
        self._heal_reports.pop(replica_id, None)
        self._gone[replica_id] = kind
        self._gone.move_to_end(replica_id)
        while len(self._gone) > _GONE_CAPACITY:
            self._gone.popitem(last=False)
        if self.metrics is not None:
            self.metrics.replica_gone(replica_id)

    def to_json(self, now: float, now_unix_ms: int) -> dict[str, Any]:
        """The ``history`` and ``timeline`` parts of ``/status`` at ``now``."""
        return {
            "now_unix_ms": now_unix_ms,
            "window_s": self.steps.window_s,
            "sample_interval_s": self.steps.sample_interval_s,
            "replicas": [s.to_json() for s in self.steps.series(now)],
            "timeline": [e.to_json() for e in self.timeline.events()],
            "timeline_capacity": self.timeline.capacity,
            "timeline_total": self.timeline.total,
            "heals_reported": self.heals_reported,
            "heal_bytes_total": self.heal_bytes_total,
            "integrity_findings": self.integrity_findings,
            "heals": [
                {"replica_id": rid, "unix_ms": ms, "step": h.step, **_heal_fields(h)}
                for rid, (h, ms) in reversed(self._last_heal.items())
            ][:_HEALS_SHOWN],
        }
