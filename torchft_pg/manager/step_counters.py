"""A rank's step counters and how a commit vote moves them: pure bookkeeping.

`step` counts committed optimizer steps and `batches_committed` the
participants summed over them (torchft's names; both are in the Manager's
`state_dict`). A heal received during a step carries the source's counters;
they are held in `healed` and take effect only if the step commits, because
every rank of a group must vote on the step it asked its quorum for (one
rank's heal may fail while another's succeeds).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepCounters", "checked_counters"]

INT64_LIMIT = 2**63  # the wire carries steps as int64


def checked_counters(state_dict: dict[str, int]) -> dict[str, int]:
    """`step` and `batches_committed` from `state_dict`, each checked to be an int in
    [0, 2**63); raises ValueError naming the counter (KeyError if one is missing)."""
    counters = {}
    for key in ("step", "batches_committed"):
        value = state_dict[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT64_LIMIT:
            raise ValueError(
                f"load_state_dict: {key} must be an int >= 0 and < 2**63, got {value!r}"
            )
        counters[key] = value
    return counters


@dataclass
class StepCounters:
    """The counters one rank keeps across steps.

    `commit_failures`: failed commits in a row (sent with each quorum request,
    so the lighthouse issues a new quorum id after one). `quorum_step`: the
    step this rank sent with its latest quorum request, the one it votes on.
    `healed`: the counters a heal received this step, not yet committed;
    `healing_to`: the step a heal still to be received this step brings
    (an asynchronous quorum receives it at the vote).
    """

    step: int = 0
    batches_committed: int = 0
    commit_failures: int = 0
    quorum_step: int = 0
    healed: dict[str, int] | None = None
    healing_to: int | None = None

    def current_step(self) -> int:
        """The step this rank is at: a heal's step (received, or to be received
        this step) until the vote settles it."""
        healed = self.healed
        if healed is not None:
            return healed["step"]
        return self.step if self.healing_to is None else self.healing_to

    def begin_quorum(self) -> None:
        """A new quorum is requested for the current committed step."""
        self.healed = None
        self.healing_to = None
        self.quorum_step = self.step

    def take_healed(self) -> dict[str, int] | None:
        """The heal's counters (None if nothing healed), cleared for the vote to settle."""
        healed, self.healed = self.healed, None
        self.healing_to = None
        return healed

    def settle(self, committed: bool, participants: int, healed: dict[str, int] | None) -> None:
        """Apply a vote: a committed step adopts `healed` (if any), then counts one
        step and `participants` batches; a discarded one counts one failure more."""
        if committed and healed is not None:
            self.step, self.batches_committed = healed["step"], healed["batches_committed"]
        if committed:
            self.step += 1
            self.batches_committed += participants
            self.commit_failures = 0
        else:
            self.commit_failures += 1

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "batches_committed": self.batches_committed}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Restore `state_dict()`'s counters, checked by `checked_counters`."""
        counters = checked_counters(state_dict)
        self.step = counters["step"]
        self.batches_committed = counters["batches_committed"]
