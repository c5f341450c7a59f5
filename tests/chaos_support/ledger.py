"""The supervisor's record of what the replicas committed, and the invariants checked on it.

Fed with the trainers' events as they arrive; every check names the replica,
the step and the quorum involved:

* a replica's committed step never goes backwards (within one incarnation);
* one step, one quorum: two quorums committing the same step would be a split
  brain, and one of their histories would be lost at the next heal;
* no replica commits in a lighthouse epoch older than one it committed in;
* every replica's group rank `g` that committed step `s` holds the same state
  after it (digests). Group ranks are compared with their own kind only: each
  group rank has its own cross-replica process group, whose participants
  differ on a fresh job (every group rank heals from its own primary);
* every committer of `s` divided the same way (the number of participants) and
  applied the same averaged gradient (its norm, bit for bit: an allreduce gives
  every member the same result);
* a group never commits a step one of its ranks died in before voting.

`history(final_step, group_rank)` then hands the committed steps of one group
rank, with their participants' batches, to the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.chaos_support.events import Contribution, Dying, StepEnded
from tests.chaos_support.oracle import Batch, CommittedStep, History
from tests.chaos_support.workload import Workload

__all__ = ["Ledger"]

# Phases a rank dies in before its group's vote on that step is complete.
_BEFORE_VOTE = frozenset(
    {"forward", "allreduce_before", "allreduce_after", "commit_before", "configure", "heal_recv"}
)


@dataclass
class _Commit:
    quorum: str
    divisor: int
    digest: str
    grad_norm: float | None
    first: str  # who reported it first, for messages


@dataclass
class Ledger:
    workload: Workload
    failures: list[str] = field(default_factory=list)
    commits: int = 0
    quorum_ids: list[str] = field(default_factory=list)
    # (quorum, step, group rank) -> replica -> its contribution
    _contributions: dict[tuple[str, int, int], dict[int, Contribution]] = field(
        default_factory=dict
    )
    _steps: dict[tuple[int, int], _Commit] = field(default_factory=dict)  # (step, group rank)
    _last_step: dict[tuple[int, int], int] = field(default_factory=dict)  # (replica, inc)
    _epochs_seen: list[str] = field(default_factory=list)
    _epoch_of_last: dict[int, str] = field(default_factory=dict)
    _group_commits: set[tuple[int, int, int]] = field(default_factory=set)  # (replica, inc, step)
    _deaths: list[Dying] = field(default_factory=list)

    def contribution(self, event: Contribution) -> None:
        key = (event.quorum, event.step, event.group_rank)
        self._contributions.setdefault(key, {})[event.replica] = event

    def death(self, event: Dying) -> None:
        self._deaths.append(event)

    def step_ended(self, event: StepEnded) -> None:
        if not event.committed:
            return
        who = f"replica {event.replica} rank {event.group_rank} (inc {event.incarnation})"
        assert event.digest is not None  # a commit always carries its digest
        first = self._steps.get((event.step, event.group_rank))
        if first is None:
            self._steps[(event.step, event.group_rank)] = _Commit(
                event.quorum, event.participants, event.digest, event.grad_norm, who
            )
        else:
            if first.digest != event.digest:
                self.failures.append(
                    f"state after step {event.step} differs: {who} has {event.digest} "
                    f"({event.quorum}), {first.first} has {first.digest} ({first.quorum})"
                )
            if first.grad_norm != event.grad_norm:
                self.failures.append(
                    f"step {event.step}: {who} applied a gradient of norm {event.grad_norm!r}, "
                    f"{first.first} one of norm {first.grad_norm!r}"
                )
            if first.divisor != event.participants:
                self.failures.append(
                    f"step {event.step}: {who} divided by {event.participants} participants, "
                    f"{first.first} by {first.divisor}"
                )
        if event.group_rank != 0:
            return
        self._group_commits.add((event.replica, event.incarnation, event.step))
        self._replica_commit(event)

    def _replica_commit(self, event: StepEnded) -> None:
        replica, step, qid = event.replica, event.step, event.quorum
        self.commits += 1
        self.quorum_ids.append(qid)
        epoch = qid.split("/")[0]
        if epoch not in self._epochs_seen:
            self._epochs_seen.append(epoch)
        elif self._epoch_of_last.get(replica, epoch) != epoch and self._epochs_seen.index(
            epoch
        ) < self._epochs_seen.index(self._epoch_of_last[replica]):
            self.failures.append(f"replica {replica} went back to an old lighthouse epoch: {qid}")
        self._epoch_of_last[replica] = epoch
        key = (replica, event.incarnation)
        if step <= self._last_step.get(key, -1):
            self.failures.append(
                f"replica {replica} step went backwards: {step} after {self._last_step[key]}"
            )
        self._last_step[key] = step
        first = self._steps[(step, 0)]
        if first.quorum != qid:
            self.failures.append(
                f"step {step} committed in two quorums: {first.quorum} and {qid} (replica {replica})"
            )

    def finish(self) -> None:
        """The checks that need every event: a group's commit against its ranks' deaths."""
        for d in self._deaths:
            if (
                d.phase in _BEFORE_VOTE
                and (d.replica, d.incarnation, d.step) in self._group_commits
            ):
                self.failures.append(
                    f"replica {d.replica} (inc {d.incarnation}) committed step {d.step} although "
                    f"its rank {d.group_rank} died in {d.phase} of that step, before voting"
                )

    def history(self, final_step: int, group_rank: int = 0) -> tuple[History | None, list[str]]:
        """The committed steps 0..final_step-1 of `group_rank`'s process group with
        their participants, or why there is none."""
        problems = []
        steps = []
        for s in range(final_step):
            commit = self._steps.get((s, group_rank))
            if commit is None:
                problems.append(
                    f"no replica reported committing step {s} (group rank {group_rank})"
                )
                continue
            contributions = self._contributions.get((commit.quorum, s, group_rank), {})
            batches = []
            for replica in sorted(contributions):
                c = contributions[replica]
                if c.divisor != commit.divisor:
                    problems.append(
                        f"step {s} ({commit.quorum}): replica {replica} contributed expecting "
                        f"{c.divisor} participants, the committers divided by {commit.divisor}"
                    )
                if c.participating:
                    if c.data_step != s:
                        problems.append(
                            f"step {s} ({commit.quorum}): replica {replica} contributed its batch "
                            f"of step {c.data_step}: it took part while not at the quorum's step"
                        )
                    batches.append(
                        Batch(
                            replica=replica,
                            data_step=c.data_step,
                            loss=c.loss,
                            sent_norm=c.sent_norm,
                        )
                    )
            steps.append(
                CommittedStep(
                    step=s,
                    divisor=commit.divisor,
                    batches=tuple(batches),
                    quorum=commit.quorum,
                    grad_norm=commit.grad_norm,
                    digest=commit.digest,
                )
            )
        if problems:
            return None, problems
        return History(workload=self.workload, steps=tuple(steps)), []
