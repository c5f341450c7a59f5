"""What a DiLoCo chaos trainer rank tells its supervisor, beyond the DDP trainer's events.

A DiLoCo replica's state is its own between syncs, so the replay
(`diloco_oracle.py`) must follow every replica's *trace*: the inner steps it
took and every moment its state changed for another reason. Each trace event
carries `inner_steps`, the data steps (``Workload.batch(replica, data_step)``)
of the inner steps the rank took since its previous trace event, in order,
so the events of one rank incarnation, in the order sent, are its whole
history:

* `Serving`: the rank's state is being copied for a healer now (heal source);
* `Healed`: the rank took a source's state (`SnapshotId` names which copy);
* `PseudoGradient`: the rank issued a sync's allreduce (sent before any of its
  data leaves the process, so a rank that dies right after still counts);
* `OuterStepEnded`: a sync ended (a `StepEnded`: the supervisor's step), with
  the fragment it restored, committed or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.chaos_support.events import Event, StepEnded

__all__ = ["Healed", "OuterStepEnded", "PseudoGradient", "Serving", "SnapshotId", "TraceEvent"]


@dataclass(frozen=True, kw_only=True)
class SnapshotId:
    """One copy of a rank's state served to healers: its `serve`-th, counted from 0."""

    replica: int
    incarnation: int
    serve: int


@dataclass(frozen=True, kw_only=True)
class TraceEvent(Event):
    inner_steps: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Serving(TraceEvent):
    """The rank's state is copied now for a healer at outer step `step`; `serve` numbers it."""

    serve: int
    step: int


@dataclass(frozen=True, kw_only=True)
class Healed(TraceEvent):
    """The rank loaded `source`'s state, served at outer step `step`."""

    source: SnapshotId
    step: int


@dataclass(frozen=True, kw_only=True)
class PseudoGradient(TraceEvent):
    """The rank issued the allreduce of `fragment`'s pseudo-gradient for outer step `step`.

    `participating`: it sends its pseudo-gradient (False: zeros); `divisor`: the
    number of participants the sum is divided by; `digest`: of the pseudo-gradient
    it computed (every parameter of the fragment), `norm`: its L2 norm.
    """

    quorum: str
    step: int
    fragment: int
    participating: bool
    divisor: int
    digest: str
    norm: float


@dataclass(frozen=True, kw_only=True)
class OuterStepEnded(StepEnded):
    """A sync of `fragment` ended (`StepEnded.step`: the outer step voted on).

    The fragment's parameters were set back to its global ones and, on a
    commit, stepped by the outer optimizer. `outer_steps`: the outer steps
    the rank's outer optimizers took in all, after this sync; `inner_steps`
    as for `TraceEvent`. `digest` (after a commit) is of the global state
    (`diloco_workload.global_digest`); `grad_norm` of the averaged
    pseudo-gradient the outer optimizer applied.
    """

    inner_steps: tuple[int, ...]
    fragment: int
    outer_steps: int
