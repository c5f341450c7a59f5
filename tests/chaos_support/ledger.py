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
* a group never commits a step one of its ranks died in before voting;
* a replica whose state a CORRUPT_STATE fault changed (`corruption`) is the
  only one allowed to commit a different state, and only until its
  integrity check catches it: `detect_within` steps after the corruption at
  the latest, its commits must be the others' state again (it was voted out
  and healed). Its commits meanwhile go to the oracle, which replays the
  corrupted copy too.

`history(final_step, group_rank)` then hands the committed steps of one group
rank, with their participants' batches, to the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.chaos_support.events import Contribution, Corrupted, Dying, StepEnded
from tests.chaos_support.oracle import Batch, CommittedStep, Corruption, History
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
class _Open:
    """A corruption not yet healed: of `incarnation`, fired at `step`."""

    incarnation: int
    step: int


@dataclass
class Ledger:
    workload: Workload
    # Steps after a corruption by which the corrupt replica must be caught and healed
    # (the integrity check's interval plus the heal's step); None: never checked.
    detect_within: int | None = None
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
    _corruptions: list[Corrupted] = field(default_factory=list)
    _open: dict[tuple[int, int], _Open] = field(default_factory=dict)  # (replica, group rank)
    # (step, group rank) -> replica -> the digest a corrupt replica committed
    _suspect: dict[tuple[int, int], dict[int, str]] = field(default_factory=dict)
    # (replica, group rank, step corrupted, step healed at): every corruption healed
    healed: list[tuple[int, int, int, int]] = field(default_factory=list)

    def contribution(self, event: Contribution) -> None:
        key = (event.quorum, event.step, event.group_rank)
        self._contributions.setdefault(key, {})[event.replica] = event

    def death(self, event: Dying) -> None:
        self._deaths.append(event)

    def corruption(self, event: Corrupted) -> None:
        self._corruptions.append(event)
        self._open[(event.replica, event.group_rank)] = _Open(event.incarnation, event.step)

    def open_corruptions(self) -> list[int]:
        """The replicas that hold a corrupt state not yet caught and healed."""
        return sorted({replica for replica, _ in self._open})

    def forget_replica(self, replica: int) -> None:
        """The replica's group died: a corruption it held died with it."""
        for key in [k for k in self._open if k[0] == replica]:
            del self._open[key]

    def _suspect_commit(self, event: StepEnded, opened: _Open) -> None:
        """A commit by a replica whose state was corrupted: kept aside (not compared
        with the others'), and compared as the others' digest for the step is known."""
        assert event.digest is not None
        key = (event.step, event.group_rank)
        self._suspect.setdefault(key, {})[event.replica] = event.digest
        self._settle(key)

    def _settle(self, key: tuple[int, int]) -> None:
        """Close the corruptions healed by step `key[0]` (their commit has the others'
        state); fail those still different past `detect_within`."""
        step, group_rank = key
        clean = self._steps.get(key)
        if clean is None:
            return
        for replica, digest in list(self._suspect.get(key, {}).items()):
            opened = self._open.get((replica, group_rank))
            if opened is None:
                continue
            if digest == clean.digest:
                del self._open[(replica, group_rank)]
                self.healed.append((replica, group_rank, opened.step, step))
            elif self.detect_within is not None and step >= opened.step + self.detect_within:
                self.failures.append(
                    f"replica {replica} rank {group_rank} still commits a corrupt state at step "
                    f"{step} ({digest} against the others' {clean.digest}), {step - opened.step} "
                    f"steps after its corruption at step {opened.step}: the integrity check did "
                    f"not catch it within {self.detect_within} steps"
                )
                del self._open[(replica, group_rank)]

    def step_ended(self, event: StepEnded) -> None:
        if not event.committed:
            return
        who = f"replica {event.replica} rank {event.group_rank} (inc {event.incarnation})"
        assert event.digest is not None  # a commit always carries its digest
        opened = self._open.get((event.replica, event.group_rank))
        if opened is not None and opened.incarnation == event.incarnation:
            self._suspect_commit(event, opened)
            if event.group_rank == 0:
                self._group_commits.add((event.replica, event.incarnation, event.step))
                self._replica_commit(event)
            return
        first = self._steps.get((event.step, event.group_rank))
        if first is None:
            self._steps[(event.step, event.group_rank)] = _Commit(
                event.quorum, event.participants, event.digest, event.grad_norm, who
            )
            self._settle((event.step, event.group_rank))
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
        first = self._steps.get((step, 0))
        if first is not None and first.quorum != qid:
            self.failures.append(
                f"step {step} committed in two quorums: {first.quorum} and {qid} (replica {replica})"
            )

    def finish(self) -> None:
        """The checks that need every event: a group's commit against its ranks'
        deaths, and every corruption caught."""
        for (replica, group_rank), opened in sorted(self._open.items()):
            self.failures.append(
                f"replica {replica} rank {group_rank} (inc {opened.incarnation}): its state, "
                f"corrupted at step {opened.step}, was never caught and healed"
            )
        for d in self._deaths:
            if (
                d.phase in _BEFORE_VOTE
                and (d.replica, d.incarnation, d.step) in self._group_commits
            ):
                self.failures.append(
                    f"replica {d.replica} (inc {d.incarnation}) committed step {d.step} although "
                    f"its rank {d.group_rank} died in {d.phase} of that step, before voting"
                )

    def data_stream(self, final_step: int, group_world_size: int) -> tuple[list[int], list[str]]:
        """The dataset indices the committed steps 0..final_step-1 used, in stream order
        (by step, then participant rank, then group rank), from the participants'
        contributions to the committing quorum; and what made that impossible."""
        stream: list[int] = []
        problems: list[str] = []
        for s in range(final_step):
            parts: list[tuple[int, int, tuple[int, ...]]] = []
            for g in range(group_world_size):
                commit = self._steps.get((s, g))
                if commit is None:
                    problems.append(f"data: no commit of step {s} by group rank {g}")
                    continue
                for replica, c in self._contributions.get((commit.quorum, s, g), {}).items():
                    if not c.participating:
                        continue
                    if c.participant_rank is None:
                        problems.append(
                            f"data: step {s}: replica {replica} took part with no participant rank"
                        )
                        continue
                    parts.append((c.participant_rank, g, c.indices))
            for _, _, indices in sorted(parts):
                stream.extend(indices)
        return stream, problems

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
                            state_digest=c.state_digest,
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
                    # the commits while corrupt (the healing commit has the others' state)
                    corrupt_digests=tuple(
                        sorted(
                            (replica, digest)
                            for replica, digest in self._suspect.get((s, group_rank), {}).items()
                            if digest != commit.digest
                        )
                    ),
                )
            )
        if problems:
            return None, problems
        corruptions = tuple(
            Corruption(replica=c.replica, step=c.step, tensor=c.tensor, index=c.index, bit=c.bit)
            for c in self._corruptions
            if c.group_rank == group_rank
        )
        return History(workload=self.workload, steps=tuple(steps), corruptions=corruptions), []
