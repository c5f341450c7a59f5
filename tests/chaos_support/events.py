"""What a chaos trainer rank tells its supervisor, and what the supervisor tells it back.

Every event names its rank (`replica`, `group_rank`, `incarnation`) and carries
the wall-clock time `at` (seconds, `time.time()`) it was sent. Events cross a
pipe between the supervisor and its own child processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.chaos_support.workload import FlatState

__all__ = [
    "Contribution",
    "Corrupted",
    "Done",
    "Dying",
    "Error",
    "Event",
    "FaultFired",
    "Finish",
    "Frozen",
    "Joined",
    "Ready",
    "Release",
    "Started",
    "StepEnded",
    "StraggleEnded",
]


@dataclass(frozen=True, kw_only=True)
class Event:
    replica: int
    group_rank: int
    incarnation: int
    at: float


@dataclass(frozen=True, kw_only=True)
class Started(Event):
    pid: int


@dataclass(frozen=True, kw_only=True)
class Ready(Event):
    """The Manager is constructed; `manager_s`: how long that took."""

    manager_s: float


@dataclass(frozen=True, kw_only=True)
class FaultFired(Event):
    planned_step: int
    fault: str
    step: int  # the rank's step when it fired


@dataclass(frozen=True, kw_only=True)
class Contribution(Event):
    """Sent as the rank issues a step's allreduce, before its data leaves the process.

    `participating`: it contributes its gradient (False: a healer or spare
    sending zeros); `divisor`: the number of participants the sum is divided
    by; `data_step`: the step its batch was drawn for; `loss`: its loss on it;
    `sent_norm`: the L2 norm of what it sends (its gradient bucket; 0 for zeros);
    `state_digest`: the digest of the state its gradient was taken at (before its
    forward), which the oracle matches with the committed state or a known
    corruption of it. `indices`: what an `ExactlyOnceBatchSampler` on this
    rank's Manager gave it for the step (the data-plan oracle).
    """

    quorum: str  # "epoch/quorum id"
    step: int  # the step being voted on
    participating: bool
    divisor: int
    data_step: int
    loss: float
    sent_norm: float = 0.0
    state_digest: str | None = None
    # the data-plan oracle: this rank's place among the step's participants (None:
    # it does not take part) and the dataset indices its sampler gave it for the step
    participant_rank: int | None = None
    indices: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StraggleEnded(Event):
    """A STRAGGLE ran its course at the rank's step `step`: `healed`, it was left
    out of the quorum and healed back in; otherwise its steps ran out."""

    step: int
    healed: bool


@dataclass(frozen=True, kw_only=True)
class Corrupted(Event):
    """A CORRUPT_STATE fault flipped bit `bit` of element `index` of `tensor` (named
    as in `workload.state_tensors`) at the rank's step `step`, before its forward."""

    step: int
    tensor: str
    index: int
    bit: int


@dataclass(frozen=True, kw_only=True)
class StepEnded(Event):
    """One step attempt: `step` is the step voted on. After a commit: `digest` of the
    state, and `grad_norm`, the L2 norm of the averaged gradient the optimizer applied."""

    step: int
    committed: bool
    quorum: str
    participants: int
    loss: float
    digest: str | None
    grad_norm: float | None = None


@dataclass(frozen=True, kw_only=True)
class Dying(Event):
    """The rank SIGKILLs itself now, in `phase` of step `step` (a planned fault)."""

    phase: str
    step: int


@dataclass(frozen=True, kw_only=True)
class Frozen(Event):
    """The rank SIGSTOPs itself now, in `phase` of step `step`; the supervisor resumes it."""

    phase: str
    step: int
    pid: int


@dataclass(frozen=True, kw_only=True)
class Joined(Event):
    """A restarted rank's first commit, and where its time went (seconds)."""

    quorum_s: float
    configure_s: float
    heal_s: float


@dataclass(frozen=True, kw_only=True)
class Done(Event):
    step: int
    checksum: str
    state: FlatState


@dataclass(frozen=True, kw_only=True)
class Error(Event):
    message: str


@dataclass(frozen=True, kw_only=True)
class Release:
    """Supervisor -> rank: the faults planned at `planned_step` may fire from `fire_at` on;
    those of the group that do not happen to the lighthouse `others_after` steps
    later (so that a kill lands while the lighthouse is away)."""

    planned_step: int
    fire_at: int
    others_after: int = 0


@dataclass(frozen=True, kw_only=True)
class Finish:
    """Supervisor -> rank: every fault fired and the job recovered; stop at the first
    commit at or past `at_step` (and the run's `steps`) that every replica took part in."""

    at_step: int
