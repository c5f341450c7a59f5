"""The gradient allreduce across replica groups, plain or quantized.

`GradientSync.allreduce` is `Manager.allreduce`: it never raises on a failure
(the step's vote becomes no instead) and a failure notice completes it at
once. `check_allreduce` (pure) refuses bad arguments up front; the
quantized path is a `QuantizedSum` (a reduce-scatter and an allgather of
encoded shards, or one allgather of encoded contributions; see
`torchft_pg.quantization`). Its second collective is issued only once its
first completed, so every collective of the gradient sync takes its turn
of one `IssueOrder`, and the members issue them in the same order (an op
requested while a quantized sum is between its stages waits for it).
On a step the integrity check is due, with `integrity_check_gradients` on,
each op's final result is also digested for it (`gradient_digests`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import ReduceOp, Work
from torch.futures import Future

from lighthouse.types import CollectivesDone
from torchft_pg.errors import ProcessGroupAbortedError
from torchft_pg.futures import ProxyFuture, future_for
from torchft_pg.manager.gradient_digests import GradientDigests
from torchft_pg.manager.issue_order import IssueOrder, Turn
from torchft_pg.manager.notices import NoticeRouter
from torchft_pg.manager.quantized_sum import QuantizedSum, quantized_sum
from torchft_pg.manager.quorum_round import QuorumRound
from torchft_pg.manager.step_state import StepState
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.quantization import Quantization
from torchft_pg.work import ManagedWork, completed_work

__all__ = ["GradientSync", "check_allreduce", "quantized_sum"]


def check_allreduce(
    tensor: torch.Tensor,
    reduce_op: ReduceOp | ReduceOp.RedOpType,
    should_quantize: bool,
    quantization: Quantization | str,
) -> Quantization | None:
    """The quantization scheme an allreduce uses (None: not quantized); raises
    ValueError for arguments no step could reduce: AVG of a non-floating
    tensor, a quantized op other than SUM or AVG, a quantized non-floating
    tensor, an unknown scheme; TypeError for a `tensor` that is not one."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"Manager.allreduce reduces one torch.Tensor in place, got {type(tensor).__name__} "
            f"{tensor!r:.60} (wrap a value as torch.tensor(...); for several tensors call it "
            "once per tensor)"
        )
    average = reduce_op == ReduceOp.AVG
    if average and not tensor.is_floating_point():
        raise ValueError(f"AVG allreduce needs a floating tensor, got dtype {tensor.dtype}")
    scheme = Quantization.parse(quantization) if should_quantize else None
    if scheme is not None and not (average or reduce_op == ReduceOp.SUM):
        raise ValueError(f"a quantized allreduce sums or averages, got reduce_op {reduce_op}")
    if scheme is not None and not tensor.is_floating_point():
        raise ValueError(f"a quantized allreduce needs a floating tensor, got {tensor.dtype}")
    return scheme


def _never_abandoned() -> bool:
    return False  # issued at once: nothing of it is left to abandon


def _forward(source: Future[Any], to: Future[Any]) -> None:
    """Complete `to` as `source` completed."""
    try:
        value = source.value()
    except Exception as e:
        to.set_exception(e)
        return
    to.set_result(value)


class SpareBuffers:
    """Private copies' memory, reused across steps for host tensors.

    A fresh host allocation the size of a gradient bucket is served by `mmap`
    and returned to the kernel when freed, so every step would pay a page fault
    per 4 KiB page of it; in a 2-process DDP run that was a quarter of the
    fault-tolerant step's extra time. A buffer comes back here only from a
    reduction that completed (`give_back`); one an abort or deadline abandoned
    is never reused, since the retired backend may still write into it.
    Device tensors are not kept: their caching allocator already reuses
    memory without that cost.

    At most `per_shape` spare buffers per (dtype, numel), for at most `shapes`
    of them (the least recently used kind is dropped first).
    """

    def __init__(self, per_shape: int = 2, shapes: int = 64) -> None:
        self._per_shape = per_shape
        self._shapes = shapes
        self._lock = threading.Lock()
        self._spare: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}

    def copy_of(self, tensor: torch.Tensor, zero: bool) -> torch.Tensor:
        """A buffer nobody else holds, shaped like `tensor`: a copy of it, or zeros."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            return torch.zeros_like(tensor) if zero else tensor.clone()
        with self._lock:
            spares = self._spare.get((tensor.dtype, tensor.numel()))
            buffer = spares.pop() if spares else None
        if buffer is None:
            return torch.zeros_like(tensor) if zero else tensor.clone()
        buffer = buffer.view(tensor.shape)
        return buffer.zero_() if zero else buffer.copy_(tensor)

    def give_back(self, buffer: torch.Tensor) -> None:
        """Keep `buffer` for a later `copy_of`: the reduction that used it is done."""
        if buffer.device.type != "cpu" or not buffer.is_contiguous():
            return
        key = (buffer.dtype, buffer.numel())
        with self._lock:
            spares = self._spare.pop(key, [])  # re-inserted last: most recently used
            if len(spares) < self._per_shape:
                spares.append(buffer)
            self._spare[key] = spares
            while len(self._spare) > self._shapes:
                del self._spare[next(iter(self._spare))]


class GradientSync:
    """Allreduces over the cross-replica group `pg` for the step `state` describes,
    once `round` (the step's quorum) is taken.

    `timeout` bounds each allreduce; `notices` aborts the in-flight ones when
    a failure notice concerns the step; a failure is reported to `state`.
    Each completed allreduce writes the seconds from its submit to its
    completion to `state.peer_wait_ms` (in ms, measured with `clock`, seconds):
    the step's last one tells how long this rank waited for its peers, which
    the lighthouse's straggler detector needs (two clock reads per op).
    `digests` (optional) receives each completed op's final result on a step
    the integrity check compares them (a read of it; nothing on other steps).
    """

    def __init__(
        self,
        *,
        state: StepState,
        pg: ProcessGroup,
        notices: NoticeRouter,
        round: QuorumRound,
        timeout: timedelta,
        clock: Callable[[], float] = time.monotonic,
        digests: GradientDigests | None = None,
    ) -> None:
        self._state = state
        self._clock = clock
        self._digests = digests
        self._pg = pg
        self._notices = notices
        self._round = round
        self._timeout = timeout
        self._spare = SpareBuffers()
        self._order = IssueOrder()  # every collective of this group issued here, in turn

    def allreduce(
        self,
        tensor: torch.Tensor,
        should_quantize: bool,
        reduce_op: ReduceOp | ReduceOp.RedOpType,
        quantization: Quantization | str,
        *,
        private_copy: bool = True,
    ) -> Work:
        """See `Manager.allreduce`.

        `private_copy=False` (plain, unquantized ops only) reduces `tensor` in
        place, skipping a full pass over it: only for a caller that never
        reuses `tensor`'s memory after an op that did not succeed (see
        `ProxyFuture.succeeded`), since an abandoned op may write into it later.
        """
        average = reduce_op == ReduceOp.AVG
        scheme = check_allreduce(tensor, reduce_op, should_quantize, quantization)
        if self._state.errored() is not None or self._state.refuse_collective():
            return self._skipped(tensor)
        try:
            self._round.wait()
            if self._state.errored() is not None or self._state.refuse_collective():
                # The step failed while its round finished (a notice interrupted the
                # configure): its process group may be torn down or the previous
                # quorum's, so nothing is issued on it.
                return self._skipped(tensor)
            participation = self._state.participation
            # The backend reduces a private copy: an op a failure notice abandoned
            # may still complete later in the retired backend, and must then write
            # into nothing the caller reuses (DDP's buckets are reused every step).
            # The result reaches `tensor` only through `finish`, which an abort skips.
            # A caller that retires `tensor` itself after such an op (our DDP
            # replaces its buckets) asks for no copy: one pass over it fewer.
            contributes = participation.rank is not None and not self._state.healing
            in_place = not private_copy and scheme is None
            private: torch.Tensor | None = None
            if scheme is not None:
                # Encoded right here, before this call returns, into the sum's own
                # buffers: the backend never sees `tensor`, so no copy of it is needed.
                contribution = tensor if contributes else torch.zeros_like(tensor)
            elif in_place:
                private = tensor if contributes else tensor.zero_()
            else:
                private = self._spare.copy_of(tensor, zero=not contributes)
            divisor = max(participation.world_size, 1)
            # keyed by call order, taken on the caller's thread: the same on every group
            slot = self._digests.slot() if self._digests is not None else None
            view = self._state.step_view()
            done_at = CollectivesDone(epoch=view.epoch, quorum_id=view.quorum_id, step=view.step)

            def proceed() -> bool:
                """Whether an op that waited for its turn (or a sum's second stage) may
                still be issued: not once the step failed (its allreduces are skipped),
                the group broke, or the step's quorum moved on (it would meet another
                quorum's collectives)."""
                return (
                    self._state.errored() is None
                    and not self._state.refuse_collective()
                    and self._pg.errored() is None
                    and self._state.step_view() == view
                )

            submitted = self._clock()
            reduced: Callable[[], torch.Tensor]
            if scheme is not None:
                summing = QuantizedSum(
                    self._pg, contribution, scheme, order=self._order, proceed=proceed
                )
                source: Future[Any] = summing.future
                reduced, abandon = summing.total, summing.abandon
            else:
                assert private is not None
                op = ReduceOp(ReduceOp.SUM) if average else reduce_op
                if not isinstance(op, ReduceOp):  # a RedOpType; c10d also passes ReduceOp
                    op = ReduceOp(op)
                source, abandon = self._plain(private, op, proceed)

                def reduced() -> torch.Tensor:
                    return private  # the op wrote it in place
        except Exception as e:
            self._state.report_error(e)
            return self._skipped(tensor)

        def finish(_: Any) -> torch.Tensor:
            self._state.peer_wait_ms = (self._clock() - submitted) * 1000.0
            self._state.collectives_done = done_at  # every member had begun this step
            into_tensor()
            if slot is not None and self._digests is not None:
                self._digests.record(slot, tensor, reduce_op)  # what the optimizer applies
            return tensor

        def into_tensor() -> None:  # the op's result, divided for an average
            result = reduced()
            if in_place:  # the op reduced `tensor` itself
                if average:
                    tensor.div_(divisor)
                return
            if average and result.dtype == tensor.dtype:
                # one pass over the memory instead of a copy and then a division:
                # the same rounding (one division of each summed value), and at
                # a bucket's size each pass costs as much as a quarter of the op
                torch.div(result, divisor, out=tensor)
            else:  # a quantized float32 sum is cast to the tensor's dtype first
                tensor.copy_(result)
                if average:
                    tensor.div_(divisor)
            if private is not None:
                self._spare.give_back(private)  # the op is done with it

        def failed(e: Exception) -> None:
            # Completed by an abort, a timeout or an error: a collective of the op not
            # issued yet never will be, and if its peers issued theirs, this step's
            # later collectives would meet theirs out of order.
            if abandon():
                self._state.skipped_collectives = True
            self._state.report_error(e)

        proxy: ProxyFuture[torch.Tensor] = ProxyFuture(
            source, tensor, failed, self._timeout, finish
        )
        self._notices.track(proxy)
        errored = self._state.errored()
        if errored is not None:  # a failure notice raced with our submit
            proxy.abort(errored.original_exception)
        return ManagedWork(proxy)

    def _plain(
        self, private: torch.Tensor, op: ReduceOp, proceed: Callable[[], bool]
    ) -> tuple[Future[Any], Callable[[], bool]]:
        """Issue an allreduce of `private` in its turn: its work's future and what
        abandons it (True: it was never issued). Issued here and now unless an
        earlier quantized sum is between its stages, which it then follows. A
        failure to issue it here and now raises, as the backend raised it."""
        if self._order.claim():  # nothing ahead of it: no turn, no relay
            try:
                work = self._pg.allreduce([private], op)
            finally:
                self._order.unclaim()
            return work.get_future(), _never_abandoned
        relay: Future[Any] = future_for([private])
        issued = [False]

        def start(turn: Turn) -> None:
            try:
                if not proceed():
                    raise ProcessGroupAbortedError(
                        "allreduce given up before its turn came: the step failed, the "
                        "group broke or the step's quorum moved on"
                    )
                work = self._pg.allreduce([private], op)
            except Exception as e:
                turn.release()
                relay.set_exception(e)
                return
            issued[0] = True
            turn.release()
            work.get_future().add_done_callback(lambda done: _forward(done, relay))

        turn = self._order.take(start)

        def abandon() -> bool:
            return turn.cancel() or not issued[0]

        return relay, abandon

    def _skipped(self, tensor: torch.Tensor) -> Work:
        """The work of an allreduce this failed step does not issue (`tensor` is
        left as it is); its peers may issue it, so the step's later collectives
        would no longer line up with theirs (`StepState.skipped_collectives`)."""
        self._state.skipped_collectives = True
        return completed_work(tensor)
