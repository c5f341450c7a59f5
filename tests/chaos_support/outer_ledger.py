"""The supervisor's record of a DiLoCo job's traces, and the outer-step checks on it.

Fed, next to `ledger.Ledger` (which checks every commit as for DDP: steps
never go backwards, one step one quorum, the same global digest and averaged
pseudo-gradient for every committer), with the DiLoCo trainers' trace events
(`diloco_events`) and final states. It checks:

* after every committed outer step `s`, the committer's outer optimizers took
  exactly ``s + 1`` outer steps in all: none lost, none applied twice, also
  across heals (the count travels in the outer optimizers' state);
* at the end, each replica's outer step count equals its final step.

`history()` then hands every incarnation's trace to the replay (`diloco_oracle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.chaos_support.diloco_events import Healed, OuterStepEnded, TraceEvent
from tests.chaos_support.diloco_oracle import DiLoCoHistory, Record
from tests.chaos_support.diloco_workload import DiLoCoSettings
from tests.chaos_support.events import Done
from tests.chaos_support.workload import FlatState, Workload

__all__ = ["OuterLedger"]


@dataclass
class OuterLedger:
    workload: Workload
    settings: DiLoCoSettings
    failures: list[str] = field(default_factory=list)
    # every heal: (replica, incarnation, outer step healed to, source replica)
    heals: list[tuple[int, int, int, int]] = field(default_factory=list)
    traces: dict[tuple[int, int], list[Record]] = field(default_factory=dict)
    finals: dict[tuple[int, int], FlatState] = field(default_factory=dict)

    def record(self, event: TraceEvent | OuterStepEnded) -> None:
        """One trace event of a rank, in the order that rank sent them."""
        self.traces.setdefault((event.replica, event.incarnation), []).append(event)
        if isinstance(event, Healed):
            self.heals.append((event.replica, event.incarnation, event.step, event.source.replica))
        if (
            isinstance(event, OuterStepEnded)
            and event.committed
            and event.outer_steps != event.step + 1
        ):
            self.failures.append(
                f"replica {event.replica} (inc {event.incarnation}) committed outer step "
                f"{event.step} with its outer optimizers at {event.outer_steps} steps, not "
                f"{event.step + 1}: an outer step lost or applied twice"
            )

    def done(self, event: Done) -> None:
        """A rank's final state: its outer step count must be its step."""
        self.finals[(event.replica, event.incarnation)] = event.state
        counted = sum(
            int(event.state[f"outer.{f}.steps"][0]) for f in range(self.settings.fragments)
        )
        if counted != event.step:
            self.failures.append(
                f"replica {event.replica} (inc {event.incarnation}) ended at outer step "
                f"{event.step} with its outer optimizers at {counted} steps"
            )

    def history(self) -> DiLoCoHistory:
        return DiLoCoHistory(
            workload=self.workload,
            settings=self.settings,
            traces={key: tuple(trace) for key, trace in self.traces.items()},
        )
