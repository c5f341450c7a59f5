"""The DiLoCo oracle: replay every replica's trace in one process and compare with the replicas.

The ledger's digests show that the replicas agree on the global state after
each outer step; the replay shows that the agreed state is the right one.
It rebuilds every replica incarnation's model and inner optimizer and the
job's global state (`diloco_workload`) from the seed and follows each
incarnation's trace (`diloco_events`), in the order it was sent:

* inner steps: the incarnation's own batches (``Workload.batch``), Adam;
* `Serving`: its state is copied for a healer; `Healed`: it takes that copy
  (model, inner optimizer, and the global state of the copy's outer step);
* `PseudoGradient`: global minus local parameters of the fragment, which must
  be the one the schedule gives (``step % fragments``), computed from the
  global state of that step, with the digest the replica reported;
* `OuterStepEnded`: the fragment goes back to its global parameters; on a
  commit, the first committer of an outer step makes it: the participants'
  pseudo-gradients are summed in float64 and rounded once to float32
  (`exact_sum`, so the order does not matter), divided by the participants,
  and the outer optimizer steps with that; every committer must then report
  the replay's global digest, and must have held the previous outer step's
  global state.

Incarnations depend on each other only through heals (a copy exists once its
source reached it) and outer steps (every participant's pseudo-gradient is
in), so the replay advances whichever incarnation can, until none can; an
event that never can is reported. Each replica's final state (its own model
and inner optimizer, and the global state) must equal the replay's bit for
bit. Pure: a function of the recorded traces.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.chaos_support.diloco_events import (
    Healed,
    OuterStepEnded,
    PseudoGradient,
    Serving,
    SnapshotId,
    TraceEvent,
)
from tests.chaos_support.diloco_workload import (
    DiLoCoSettings,
    diloco_flat_state,
    fragment_modules,
    global_digest,
    outer_optimizers,
)
from tests.chaos_support.workload import FlatState, Workload, state_checksum

__all__ = ["DiLoCoHistory", "DiLoCoVerdict", "average", "check"]

Record = TraceEvent | OuterStepEnded
Backups = list[dict[str, torch.Tensor]]


@dataclass(frozen=True, kw_only=True)
class DiLoCoHistory:
    """Every replica incarnation's trace, keyed (replica, incarnation), each in the order sent."""

    workload: Workload
    settings: DiLoCoSettings
    traces: Mapping[tuple[int, int], Sequence[Record]]


@dataclass(frozen=True, kw_only=True)
class DiLoCoVerdict:
    failures: tuple[str, ...]
    outer_steps_replayed: int
    max_error: float  # largest |replica - replay| over every final float value

    @property
    def ok(self) -> bool:
        return not self.failures


def average(contributions: Sequence[Sequence[torch.Tensor]], divisor: int) -> list[torch.Tensor]:
    """What ``Manager.allreduce`` over `ExactSumProcessGroup` leaves in each tensor: the
    float64 sum, rounded once to float32, divided by `divisor`."""
    out = []
    for parts in zip(*contributions, strict=True):
        total = torch.zeros(parts[0].shape, dtype=torch.float64)
        for p in parts:
            total += p.to(torch.float64)
        out.append(total.to(torch.float32).div_(divisor))
    return out


@dataclass
class _Local:
    """One incarnation's own state and which outer step's global state it holds."""

    model: torch.nn.Module
    inner: torch.optim.Optimizer
    fragments: list[torch.nn.Module]
    view: int = 0
    cursor: int = 0


@dataclass(frozen=True, kw_only=True)
class _Copy:
    model: dict[str, torch.Tensor]
    inner: dict[str, Any]
    view: int


@dataclass
class _Replay:
    history: DiLoCoHistory
    failures: list[str] = field(default_factory=list)
    locals: dict[tuple[int, int], _Local] = field(default_factory=dict)
    copies: dict[SnapshotId, _Copy] = field(default_factory=dict)
    sent: dict[tuple[str, int], list[list[torch.Tensor]]] = field(default_factory=dict)
    backups: list[Backups] = field(default_factory=list)  # the global parameters after s steps
    quorum_of: dict[int, str] = field(default_factory=dict)  # outer step -> its quorum
    digest_of: dict[int, str] = field(default_factory=dict)  # outer step -> global digest after

    def __post_init__(self) -> None:
        w, s = self.history.workload, self.history.settings
        model, _ = w.build()
        self.global_fragments = fragment_modules(model, s.fragments)
        self.outers = outer_optimizers(self.global_fragments, s)
        self.backups.append(self._global_now())
        for key in self.history.traces:
            m, inner = w.build()
            self.locals[key] = _Local(m, inner, fragment_modules(m, s.fragments))

    def _global_now(self) -> Backups:
        return [
            {name: p.detach().clone() for name, p in f.named_parameters()}
            for f in self.global_fragments
        ]

    def _fail(self, message: str) -> None:
        if message not in self.failures:
            self.failures.append(message)

    # -- advancing ---------------------------------------------------------------
    def run(self) -> None:
        progress = True
        while progress:
            progress = False
            for key, local in self.locals.items():
                trace = self.history.traces[key]
                while local.cursor < len(trace) and self._ready(trace[local.cursor]):
                    self._apply(key, local, trace[local.cursor])
                    local.cursor += 1
                    progress = True
        for key, local in self.locals.items():
            trace = self.history.traces[key]
            if local.cursor < len(trace):
                ev = trace[local.cursor]
                self._fail(
                    f"replay stuck: replica {key[0]} (inc {key[1]}) at its {type(ev).__name__} "
                    f"of outer step {getattr(ev, 'step', '?')}: {self._waiting_for(ev)}"
                )

    def _ready(self, ev: Record) -> bool:
        if isinstance(ev, Healed):
            return ev.source in self.copies
        if isinstance(ev, OuterStepEnded) and ev.committed:
            made = len(self.backups) - 1
            if made > ev.step:
                return True
            return made == ev.step and len(self.sent.get((ev.quorum, ev.step), [])) >= max(
                ev.participants, 1
            )
        return True

    def _waiting_for(self, ev: Record) -> str:
        if isinstance(ev, Healed):
            return f"the copy {ev.source} was never served"
        if isinstance(ev, OuterStepEnded):
            got = len(self.sent.get((ev.quorum, ev.step), []))
            return (
                f"outer step {ev.step} needs {ev.participants} pseudo-gradients of quorum "
                f"{ev.quorum} (has {got}) and the global state of step {ev.step} "
                f"(has {len(self.backups) - 1})"
            )
        return "?"

    def _apply(self, key: tuple[int, int], local: _Local, ev: Record) -> None:
        who = f"replica {key[0]} (inc {key[1]})"
        w = self.history.workload
        for data_step in ev.inner_steps:
            local.inner.zero_grad()
            x, y = w.batch(key[0], data_step)
            w.loss(local.model(x), y).backward()
            local.inner.step()
        if isinstance(ev, Serving):
            self.copies[SnapshotId(replica=key[0], incarnation=key[1], serve=ev.serve)] = _Copy(
                model={k: v.clone() for k, v in local.model.state_dict().items()},
                inner=copy.deepcopy(local.inner.state_dict()),
                view=local.view,
            )
        elif isinstance(ev, Healed):
            c = self.copies[ev.source]
            local.model.load_state_dict(c.model)
            local.inner.load_state_dict(copy.deepcopy(c.inner))
            local.view = c.view
            if c.view != ev.step:
                self._fail(
                    f"{who} healed to outer step {ev.step} from {ev.source}, whose global state "
                    f"was that of outer step {c.view}"
                )
        elif isinstance(ev, PseudoGradient):
            self._pseudo_gradient(who, local, ev)
        elif isinstance(ev, OuterStepEnded):
            self._sync_ended(who, local, ev)

    def _pseudo_gradient(self, who: str, local: _Local, ev: PseudoGradient) -> None:
        n = self.history.settings.fragments
        if ev.fragment != ev.step % n:
            self._fail(
                f"{who} synced fragment {ev.fragment} as outer step {ev.step} ({ev.quorum}); "
                f"the schedule gives fragment {ev.step % n}: its peers sent another fragment"
            )
        if local.view != ev.step:
            self._fail(
                f"{who} computed its pseudo-gradient for outer step {ev.step} from the global "
                f"parameters of outer step {local.view}"
            )
        backup = self.backups[min(local.view, len(self.backups) - 1)][ev.fragment]
        with torch.no_grad():
            pseudo = [
                backup[name] - p.detach()
                for name, p in local.fragments[ev.fragment].named_parameters()
            ]
        if state_checksum(pseudo) != ev.digest:
            self._fail(
                f"{who} sent a pseudo-gradient for outer step {ev.step} ({ev.quorum}) with digest "
                f"{ev.digest}, the replay of its trace gives {state_checksum(pseudo)}: its local "
                "state before the sync was not the one its history gives"
            )
        if ev.participating:
            self.sent.setdefault((ev.quorum, ev.step), []).append(pseudo)

    def _sync_ended(self, who: str, local: _Local, ev: OuterStepEnded) -> None:
        f = ev.fragment
        view = min(local.view, len(self.backups) - 1)
        with torch.no_grad():
            for name, p in local.fragments[f].named_parameters():
                p.copy_(self.backups[view][f][name])
        if not ev.committed:
            return
        if local.view != ev.step:
            self._fail(
                f"{who} committed outer step {ev.step} ({ev.quorum}) holding the global state "
                f"of outer step {local.view}"
            )
        if len(self.backups) - 1 == ev.step:
            self._outer_step(ev)
        elif self.quorum_of.get(ev.step) != ev.quorum:
            self._fail(
                f"outer step {ev.step} committed in quorum {ev.quorum} by {who} and in "
                f"{self.quorum_of.get(ev.step)} by another replica"
            )
        with torch.no_grad():
            for name, p in local.fragments[f].named_parameters():
                p.copy_(self.backups[ev.step + 1][f][name])
        local.view = ev.step + 1
        expected = self.digest_of[ev.step]
        if ev.digest != expected:
            self._fail(
                f"{who} committed outer step {ev.step} ({ev.quorum}) with global digest "
                f"{ev.digest}, the replay gives {expected}: the first outer step whose "
                "global state is not the committed history's"
            )

    def _outer_step(self, ev: OuterStepEnded) -> None:
        """Make outer step `ev.step` on the global state from its participants' pseudo-gradients."""
        contributions = self.sent[(ev.quorum, ev.step)]
        if len(contributions) != max(ev.participants, 1):
            self._fail(
                f"outer step {ev.step} ({ev.quorum}) divides by {ev.participants} but "
                f"{len(contributions)} replicas sent a pseudo-gradient"
            )
        avg = average(contributions, max(ev.participants, 1))
        fragment = self.global_fragments[ev.fragment]
        params = list(fragment.parameters())
        for p, g in zip(params, avg, strict=True):
            p.grad = g
        self.outers[ev.fragment].step()
        for p in params:
            p.grad = None
        self.backups.append(self._global_now())
        self.quorum_of[ev.step] = ev.quorum
        self.digest_of[ev.step] = global_digest(self.backups[-1], self.outers)

    def final_state(self, key: tuple[int, int]) -> FlatState:
        local = self.locals[key]
        return diloco_flat_state(local.model, local.inner, self.backups[-1], self.outers)


def check(history: DiLoCoHistory, finals: Mapping[tuple[int, int], FlatState]) -> DiLoCoVerdict:
    """Replay `history`; compare the replay with each replica's final state.

    `finals`: (replica, incarnation) -> the state it reported at the end, which
    must equal the replay's exactly (the replay is bit-exact); the outer step
    counts (``outer.<fragment>.steps``) are compared as well.
    """
    replay = _Replay(history)
    replay.run()
    max_error = 0.0
    for key, state in sorted(finals.items()):
        if replay.failures:
            break
        label = f"replica {key[0]} (inc {key[1]})"
        if key not in replay.locals:
            replay.failures.append(f"{label} reported a final state but no trace")
            continue
        if replay.locals[key].view != len(replay.backups) - 1:
            replay.failures.append(
                f"{label} ended holding the global state of outer step "
                f"{replay.locals[key].view}, the job made {len(replay.backups) - 1}"
            )
            continue
        expected = replay.final_state(key)
        if sorted(state) != sorted(expected):
            replay.failures.append(
                f"{label}: state keys {sorted(state)} differ from the replay's {sorted(expected)}"
            )
            continue
        worst: tuple[float, str] | None = None
        for name, want in expected.items():
            got = state[name]
            if len(got) != len(want):
                replay.failures.append(
                    f"{label}: {name} has {len(got)} values, the replay {len(want)}"
                )
                continue
            for g, e in zip(got, want, strict=True):
                err = abs(g - e) if math.isfinite(g) else math.inf
                max_error = max(max_error, err)
                if g != e and (worst is None or err > worst[0]):
                    worst = (err, f"{name}: {g!r} vs {e!r}")
        if worst is not None:
            replay.failures.append(
                f"{label}: final state differs from the replay of its trace "
                f"(worst {worst[1]}, |diff| {worst[0]:.3g})"
            )
    return DiLoCoVerdict(
        failures=tuple(replay.failures),
        outer_steps_replayed=len(replay.backups) - 1,
        max_error=max_error,
    )
