"""Plain, frozen value types shared by the lighthouse, the manager server and clients.

These never reference protobuf; ``lighthouse.wire`` converts them to and from
the gRPC messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, TypeVar

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_T = TypeVar("_T")


def copy_with(value: _T, **changes: Any) -> _T:
    """A copy of the frozen dataclass ``value`` with the fields in ``changes`` set.

    What ``dataclasses.replace`` gives, for the paths that run once per step
    (a leased round's result, a lease holder's progress) at a tenth of its cost:
    no ``__init__`` runs (about 15 us saved per call), so the values must be of
    the fields' types already. Attributes kept beside the fields are copied too.
    ``TypeError`` for a name that is not a field.
    """
    unknown = changes.keys() - value.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{type(value).__name__} has no fields {sorted(unknown)}")
    copy = object.__new__(type(value))
    copy.__dict__.update(value.__dict__)
    copy.__dict__.update(changes)
    return copy


class Timestamp(datetime):
    """A timezone-aware UTC ``datetime`` that also reads like torchft's ``Timestamp``.

    torchft's ``Quorum.created`` is a protobuf-style ``(seconds, nanos)`` pair;
    this is a real ``datetime`` (compare it, subtract it, format it) that also
    answers ``seconds`` and ``nanos``, so code written against either shape works.
    Our lighthouse stamps quorums to the millisecond, so ``nanos`` is a
    multiple of 1_000_000 for the stamps it makes.
    """

    @classmethod
    def from_unix_ms(cls, unix_ms: int) -> Timestamp:
        """The instant ``unix_ms`` milliseconds after 1970-01-01T00:00:00Z (exact, no
        float); ``ValueError`` outside years 1..9999."""
        try:
            dt = _UNIX_EPOCH + timedelta(milliseconds=unix_ms)
        except OverflowError:
            raise ValueError(f"unix_ms must fall in years 1..9999, got {unix_ms}") from None
        return cls(
            dt.year,
            dt.month,
            dt.day,
            dt.hour,
            dt.minute,
            dt.second,
            dt.microsecond,
            tzinfo=timezone.utc,
        )

    def _since_epoch(self) -> timedelta:
        # A naive value (only from .replace(tzinfo=None)) is read as UTC.
        aware: datetime = self if self.tzinfo is not None else self.replace(tzinfo=timezone.utc)
        return aware - _UNIX_EPOCH

    @property
    def seconds(self) -> int:
        """Whole seconds since the Unix epoch (floor, as in protobuf's Timestamp)."""
        d = self._since_epoch()
        return d.days * 86_400 + d.seconds

    @property
    def nanos(self) -> int:
        """Nanoseconds past ``seconds`` (0 <= nanos < 1_000_000_000)."""
        return self._since_epoch().microseconds * 1000


@dataclass(frozen=True, kw_only=True)
class HealReport:
    """What one heal moved, measured by the replica that received the state.

    A replica group that healed from a live peer reports this once, with its
    next quorum request (and liveness ping), so the lighthouse's timeline and
    ``/metrics`` show heal sizes and speeds; the lighthouse cannot see the
    transfer itself, which runs between the healer and its source.

    Attributes:
        step: the step the group healed to (the source's committed step, >= 0).
        bytes_received: checkpoint bytes received, tensor data plus the encoded
            state skeleton, summed over the group's ranks (0 <= value < 2**63).
        transfer_s: wall time of the transfer in seconds: fetching the state
            from the source and decoding it into tensors (not loading it into
            the model, which waits for the commit); the slowest rank's for a
            multi-rank group (finite, >= 0).
    """

    step: int
    bytes_received: int
    transfer_s: float

    @property
    def gb_per_s(self) -> float | None:
        """Throughput in GB/s (10**9 bytes per second); None for a zero duration."""
        return self.bytes_received / self.transfer_s / 1e9 if self.transfer_s > 0 else None


class IntegrityKind(str, Enum):
    """What a replica group's integrity check found (``IntegrityReport.kind``); the
    values are the stable tags ``/status``, the timeline and ``/metrics`` show.

    DIVERGED: the group's own state differs from the majority's (it votes no and
    heals). HEAL_SOURCE_DIVERGED: the peer the group healed from this step holds
    a state that differs from the majority's (the healed state is dropped).
    NO_MAJORITY: the groups' states (or, with the gradients checked, their
    averaged gradients) differ and none is held by a majority, so no group
    commits. GRADIENT_DIVERGED: the averaged gradient the group received from
    a step's allreduce differs from the majority's (a corrupt reduction; only
    with ``Manager(integrity_check_gradients=True)``): it votes no and heals.
    """

    DIVERGED = "diverged"
    HEAL_SOURCE_DIVERGED = "heal_source_diverged"
    NO_MAJORITY = "no_majority"
    GRADIENT_DIVERGED = "gradient_diverged"


@dataclass(frozen=True, kw_only=True)
class IntegrityReport:
    """A silent-data-corruption finding of a replica group's integrity check.

    A group that finds its own state (or its heal source's) corrupt reports
    this once, with its next quorum request, so the lighthouse's timeline,
    ``/status`` and ``/metrics`` show it and repeat offenders are quarantined
    (rule 10 in ``lighthouse.coordinator.quorum``).

    Attributes:
        step: the step the check ran at (the quorum's max step, >= 0).
        kind: what was found (``IntegrityKind``).
        tensors: the first differing tensors' names as the reporting ranks saw
            them (at most ``validate.MAX_INTEGRITY_TENSORS`` names of at most
            ``validate.MAX_TENSOR_NAME_CHARS`` characters; () when unknown,
            e.g. a healer that holds no fingerprint of its own).
    """

    step: int
    kind: IntegrityKind
    tensors: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CollectivesDone:
    """A cross-replica collective of a rank completed at ``step`` of the quorum
    (``epoch``, ``quorum_id``): every replica group of that quorum had begun
    that step, which is what a leased round needs to know of the slowest
    holder (``lighthouse.replica.lease_holder``), without asking the lighthouse.

    Attributes:
        epoch: the lighthouse epoch of the quorum (at most
            ``validate.MAX_ID_CHARS`` characters).
        quorum_id: the quorum's id (>= 0).
        step: the step the collective belonged to (>= 0).
    """

    epoch: str
    quorum_id: int
    step: int


@dataclass(frozen=True)
class QuorumMember:
    """One replica group's registration for a quorum.

    Attributes:
        replica_id: unique per incarnation of a replica group.
        address: the group's manager server, ``host:port`` ("" for bare clients).
        store_address: the group's rendezvous store, ``host:port``.
        step: the group's committed step (>= 0).
        world_size: ranks in the replica group (0 = unknown, bare clients only).
        shrink_only: ask for a quorum that only removes members.
        data: the caller's opaque value, as ``json.loads`` gives it back (a dict
            for torchft callers); None = none sent. The lighthouse never reads
            it; on the wire it is JSON text ("" = None), see ``validate.encode_data``.
            Excluded from ``hash()`` (a dict is unhashable) but not from ``==``.
        commit_failures: consecutive failed commits; > 0 forces a new quorum id.
        step_time_ms: telemetry, the group's last step duration in milliseconds (0 = unknown).
        checkpoint_metadata: per group rank, what a healing peer needs to fetch
            that rank's state (manager servers only; () = ask CheckpointMetadata).
        unreachable: replica ids of the previous quorum this group could not
            reach after its last failed step (probed by its manager server; only
            with ``commit_failures`` > 0). See rule 8 in ``coordinator.quorum``.
        heal: the group's latest heal, sent once with the first request after
            it (None: nothing to report). Telemetry only: quorums ignore it.
        integrity: the group's latest integrity-check finding, sent once with
            the first request after it (None: nothing to report); recorded by
            the lighthouse, and repeated ``DIVERGED`` reports quarantine the group.
        busy_ms: the group's own work in its last step, in milliseconds: its
            step time less the time it waited for other groups in the step's
            last cross-replica allreduce (the largest of its ranks'; 0 =
            unknown). The straggler detector compares it across groups
            (``coordinator.stragglers``): in a synchronous job the step times
            are all alike, since every group waits for the slowest.
    """

    replica_id: str
    address: str = ""
    store_address: str = ""
    step: int = 0
    world_size: int = 0
    shrink_only: bool = False
    data: Any = field(default=None, hash=False)
    commit_failures: int = 0
    step_time_ms: float = 0.0
    checkpoint_metadata: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    heal: HealReport | None = None
    integrity: IntegrityReport | None = None
    busy_ms: float = 0.0


@dataclass(frozen=True)
class Quorum:
    """A decided membership. ``participants`` are sorted by replica id.

    ``(epoch, quorum_id)`` names one membership and never repeats, even across
    lighthouse restarts (the epoch is random per lighthouse start-up).
    ``created_unix_ms`` is the lighthouse's wall clock at formation in
    milliseconds since the Unix epoch (0 = unknown); ``created`` is the same
    instant as a UTC ``datetime`` (torchft's attribute name).
    """

    quorum_id: int
    epoch: str
    participants: tuple[QuorumMember, ...]
    created_unix_ms: int = 0

    @property
    def replica_ids(self) -> list[str]:
        """Participants' replica ids in replica-rank order."""
        return [m.replica_id for m in self.participants]

    @property
    def created(self) -> Timestamp:
        """When the lighthouse formed this quorum: a timezone-aware UTC ``datetime``
        (millisecond precision) with torchft's ``seconds``/``nanos`` too."""
        return Timestamp.from_unix_ms(self.created_unix_ms)


@dataclass(frozen=True, kw_only=True)
class ManagerQuorumRequest:
    """One group rank's request to join this step's quorum, sent to its replica
    group's manager server (``ManagerClientProtocol.quorum``).

    The Manager builds one per step; clients send it (``lighthouse.wire`` encodes
    it, ``validate.check_manager_quorum_request`` checks it on both ends) and the
    manager server gathers one from every rank of the group before it asks the
    lighthouse once for the whole group.

    Attributes:
        group_rank: this rank's index in its replica group, in [0, group world size).
        step: the rank's committed step (>= 0); all ranks of a group must agree.
        checkpoint_metadata: what a healing peer needs to fetch this rank's state
            (e.g. a URL prefix), at most ``validate.MAX_METADATA_BYTES`` characters.
        timeout: how long to wait for the quorum, a positive ``timedelta``; over
            gRPC it travels as the call's deadline, not as a message field.
        shrink_only: ask for a quorum that only removes members.
        init_sync: on a fresh job (every member at step 0), heal every replica
            but the primary from it, so all start from the same state.
        commit_failures: this rank's consecutive failed commits (>= 0); > 0 forces
            a new quorum id.
        step_time_ms: telemetry, the duration of this rank's last step in
            milliseconds (finite, >= 0; 0 = unknown).
        heal: telemetry, what this rank's latest heal moved, sent once with its
            first request after the heal (None: nothing to report).
        integrity: what this rank's latest integrity check found wrong with its
            group's state (or its heal source's), sent once with its first
            request after the check (None: nothing to report).
        busy_ms: this rank's own work in its last step in milliseconds: its
            step time less how long the step's last cross-replica allreduce
            waited for the other groups (finite, 0 <= busy_ms <= step_time_ms;
            0 = unknown). Stragglers are told by it.
        collectives_done: the latest step at which a cross-replica collective of
            this rank completed, and its quorum (None: none yet): a leased
            round may follow that step without the lighthouse's floor.
    """

    group_rank: int
    step: int
    checkpoint_metadata: str
    timeout: timedelta
    shrink_only: bool = False
    init_sync: bool = True
    commit_failures: int = 0
    step_time_ms: float = 0.0
    heal: HealReport | None = None
    integrity: IntegrityReport | None = None
    busy_ms: float = 0.0
    collectives_done: CollectivesDone | None = None


@dataclass(frozen=True, kw_only=True)
class LivenessPing:
    """One ping on a manager server's liveness stream, as the lighthouse reads it.

    ``leaving``: a clean shutdown, not a death (``step`` is then the step the
    replica committed through). Otherwise ``step`` is the step of the
    replica's latest quorum round, ``step_time_ms`` its last step's duration
    and ``busy_ms`` that step's own work (see ``QuorumMember.busy_ms``), both
    in milliseconds (0 = unknown); ``heal`` its latest heal, sent once;
    ``floor_wanted``: a lease holder waits for every holder to begin this step
    (0: it does not wait, and needs no ``LeaseFloor``).
    """

    replica_id: str
    leaving: bool = False
    step: int = 0
    step_time_ms: float = 0.0
    busy_ms: float = 0.0
    heal: HealReport | None = None
    floor_wanted: int = 0


@dataclass(frozen=True)
class QuorumResult:
    """What one group rank of one replica group needs from a quorum (see ``ranks.py``).

    The Manager builds its process-group store prefix as
    ``{store_address}/torchft/{epoch}/{quorum_id}/{group_rank}``.
    """

    quorum_id: int
    epoch: str
    replica_rank: int
    replica_world_size: int
    recover_src_manager_address: str
    recover_src_replica_rank: int | None
    recover_dst_replica_ranks: list[int] = field(default_factory=list)
    store_address: str = ""
    max_step: int = 0
    max_replica_rank: int | None = None
    max_world_size: int = 0
    heal: bool = False
    commit_failures: int = 0
    replica_ids: list[str] = field(default_factory=list)
    recover_src_checkpoint_metadata: str = ""  # "" = ask the source's CheckpointMetadata


@dataclass(frozen=True)
class FailureNotice:
    """ "These members of quorum ``(epoch, quorum_id)`` died", pushed to survivors.

    ``detected_unix_ms`` is the wall clock of detection in milliseconds.
    ``step``: only that step's collectives must fail (a manager server sets it
    when a recalled lease strands a leased step); None: any step on the quorum.
    """

    epoch: str
    quorum_id: int
    dead_replica_ids: tuple[str, ...]
    reason: str = ""
    detected_unix_ms: int = 0
    step: int | None = None


@dataclass(frozen=True)
class LeaseRecall:
    """ "Stop running on lease ``lease_id`` of quorum ``quorum_id``; ask again."

    ``absent_replica_ids`` run no collectives on the lease any more (waiting at
    the lighthouse, or stalled); a holder whose leased step is at or above
    ``abort_from_step`` must fail that step now (-1: fail nothing).
    """

    epoch: str
    lease_id: int
    quorum_id: int
    absent_replica_ids: tuple[str, ...] = ()
    abort_from_step: int = -1
    valid_below_step: int = 0  # > 0: the lease still answers rounds below this step


@dataclass(frozen=True)
class LeaseFloor:
    """ "Every holder of lease ``lease_id`` has started its round at ``step`` or later."

    A holder answers a leased round at step s only once the floor is >= s - 1,
    so no holder runs more than one step ahead of the slowest.
    """

    epoch: str
    lease_id: int
    step: int


@dataclass(frozen=True, kw_only=True)
class QuorumWait:
    """Why the lighthouse has not issued the quorum a replica waits for: ``kind`` is
    the rule's tag, a plain string (the value of the lighthouse's ``DecisionKind``:
    ``min_replicas``, ``join_timeout``, ``split_brain``, ``behind``,
    ``below_committed``, ...), ``reason`` says it in words."""

    kind: str
    reason: str
