"""Digests of the step's allreduce results, for the integrity check of gradients.

With `Manager(integrity_check_gradients=True)`, at each step the integrity
check is due (`IntegrityCheck.due`), every result `Manager.allreduce`
produces (after the division of an average: what the optimizer applies) is
digested bit-exactly (`fingerprint.tensor_digest`) as its op completes. All
members of a reduction receive the same bits (healers and spares contribute
zeros and still receive the average), so at the vote the replica groups
compare these digests like their state fingerprints: a group whose averaged
gradient differs from the majority's received a corrupt reduction, which a
comparison of states would only see after the optimizer applied it, and
only if it changed the state.

Results are keyed by call index: the order in which the step called
`allreduce` (our DDP calls it bucket by bucket, in the same order on every
group running the same model), never the order ops complete in. On a step
the check is not due, `slot` answers None and nothing is digested or kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import ReduceOp

from torchft_pg.manager.fingerprint import Fingerprint, fingerprint_of, tensor_digest

__all__ = ["GradientDigests", "check_gradients"]

# The digest a result that never completed is compared with: such a step has
# failed (and sends no fingerprint), so this only keeps the vector well formed.
_NOT_COMPLETED = torch.zeros((), dtype=torch.int64)


def check_gradients(value: bool) -> bool:
    """`value` checked as `Manager(integrity_check_gradients=...)`: True or False.
    Raises ValueError naming a bad value (an int or a string is not accepted, so
    that a misplaced positional argument is not silently taken as on)."""
    if not isinstance(value, bool):
        raise ValueError(
            "integrity_check_gradients must be True or False (compare the averaged "
            f"gradients at each integrity check; default False), got {value!r}"
        )
    return value


def result_name(index: int, tensor: torch.Tensor, reduce_op: ReduceOp | ReduceOp.RedOpType) -> str:
    """How a log line and an `IntegrityReport` name the step's `index`-th allreduce
    result: its call index, element count and dtype, and its op if not AVG."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    what = f"{tensor.numel()} {dtype} values"
    if reduce_op == ReduceOp.AVG:
        return f"averaged gradient bucket {index} ({what})"
    # a ReduceOp holds its RedOpType as `op` (isinstance cannot tell them apart)
    op: Any = getattr(reduce_op, "op", reduce_op)
    return f"allreduce result {index} ({getattr(op, 'name', op)} of {what})"


class GradientDigests:
    """The digests of one step's allreduce results, while `enabled` and `due()`.

    `GradientSync` asks for a `slot` as it submits each op and `record`s the
    result (possibly on a backend thread) once the op completed; the integrity
    check `take`s the step's fingerprint at the vote. `begin_step` forgets a
    step's digests (a result recorded for an earlier step, an op that
    completed late, is dropped) and applies a change of `enabled`: a step is
    digested whole or not at all, so a change mid-step never makes a group
    number its results differently from the others.
    """

    def __init__(self, *, due: Callable[[], bool], enabled: bool = False) -> None:
        self.enabled = enabled  # the Manager's option, applied from the next step on
        self._on = enabled  # `enabled` as of this step's start
        self._due = due
        self._lock = threading.Lock()
        self._generation = 0  # counts steps, so a late result is recognized
        self._count = 0  # slots handed out this step
        self._names: dict[int, str] = {}
        self._digests: dict[int, torch.Tensor] = {}

    def begin_step(self) -> None:
        """A new step starts: its results are counted from index 0."""
        with self._lock:
            self._on = self.enabled
            self._generation += 1
            self._count = 0
            self._names.clear()
            self._digests.clear()

    def slot(self) -> tuple[int, int] | None:
        """(step generation, call index) for the op being submitted, or None on a
        step the check is not due (or with the option off): nothing to digest."""
        if not self._on or not self._due():
            return None
        with self._lock:
            index = self._count
            self._count += 1
            return self._generation, index

    def record(
        self,
        slot: tuple[int, int],
        result: torch.Tensor,
        reduce_op: ReduceOp | ReduceOp.RedOpType,
    ) -> None:
        """Digest `result`, the op's final value (after the division of an average),
        on its own device; the host copy waits for `take`."""
        digest = tensor_digest(result)
        name = result_name(slot[1], result, reduce_op)
        with self._lock:
            if slot[0] != self._generation:
                return  # an op of an earlier step completed late
            self._names[slot[1]] = name
            self._digests[slot[1]] = digest

    def take(self) -> Fingerprint | None:
        """This step's digests in call order (one int64 per result to the host),
        then forgotten; None if the option was off this step. A result that
        never completed counts as digest 0."""
        with self._lock:
            on, count = self._on, self._count
            names, digests = dict(self._names), dict(self._digests)
            self._generation += 1  # nothing of this step is kept past its check
            self._count = 0
            self._names.clear()
            self._digests.clear()
        if not on:
            return None
        return fingerprint_of(
            [names.get(i, f"allreduce {i} (not completed)") for i in range(count)],
            [digests.get(i, _NOT_COMPLETED) for i in range(count)],
        )
