"""`QuantizedSum`: the collectives of one quantized allreduce, in one or two stages.

The arithmetic is `torchft_pg.quantization`'s; this module issues it on a
process group, for `GradientSync` (`Manager.allreduce(should_quantize=True)`,
DiLoCo's quantized sync):

* ``Exchange.ALLGATHER``: one allgather of every member's encoding (into one
  flat buffer), summed once it completes.
* ``Exchange.REDUCE_SCATTER``: an alltoall of the encoded shards (shard ``j``
  to member ``j``); once it completes, this member's shards are summed and
  re-encoded (on the thread that completed it) and the allgather of the
  summed shards is issued; once that completes, `future` does. The second
  collective is issued from the first one's completion, so the sum holds its
  `Turn` of the group's `IssueOrder` until then: every member issues the
  group's collectives in the same order (see `issue_order`).

`future` completes (with None) when `total()` is ready, or fails with the
first stage's error. `abandon` (the op's caller no longer wants it: a failure
notice aborted it, or it timed out) stops it from issuing a collective it has
not issued yet, and lets the group's next op take its turn at once. The
backend only ever writes buffers of this object's own, never the caller's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import AllToAllOptions, Work
from torch.futures import Future

from torchft_pg._torch_internals import AllgatherOptions
from torchft_pg.errors import ProcessGroupAbortedError
from torchft_pg.manager.issue_order import IssueOrder, Turn
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.quantization import (
    Exchange,
    Quantization,
    choose_exchange,
    decode_shards,
    encode,
    encode_shards,
    reduce_shards,
    shard_layout,
    sum_encoded,
)

__all__ = ["QuantizedSum", "quantized_sum"]


def _always() -> bool:
    return True


class QuantizedSum:
    """The float32 sum of every member's `contribution` over `pg`, encoded as
    `scheme`, in the exchange `choose_exchange` picks (or `exchange`).

    `contribution` is encoded here, on the caller's thread: the caller may
    reuse it as soon as this returns. The first collective is issued when the
    sum's turn of `order` comes (at once if nothing is ahead of it; a fresh
    order by default). `proceed` is asked before each collective issued on a
    later turn or stage, and False (the group broke, the step is over) gives
    the sum up with `ProcessGroupAbortedError` instead of issuing it.
    """

    def __init__(
        self,
        pg: ProcessGroup,
        contribution: torch.Tensor,
        scheme: Quantization,
        *,
        order: IssueOrder | None = None,
        exchange: Exchange | None = None,
        proceed: Callable[[], bool] = _always,
    ) -> None:
        numel, world = contribution.numel(), pg.size()
        self.exchange = exchange if exchange is not None else choose_exchange(numel, world, scheme)
        self.future: Future[Any] = Future()
        self._pg = pg
        self._shape = contribution.shape
        self._pg_size = world
        self._numel = numel
        self._scheme = scheme
        self._proceed = proceed
        self._lock = threading.Lock()
        self._issued_all = False  # every collective of the sum was issued
        self._abandoned = False
        self._settled = False  # `future` completed (or is being completed)
        self._layout = shard_layout(numel, world, scheme)
        if self.exchange is Exchange.ALLGATHER:
            self._outgoing = encode(contribution, scheme)
            # one flat buffer, member j's encoding at j * its size: Gloo then writes
            # it in place, with no copy out into a list of tensors
            self._received = self._outgoing.new_empty(world * self._outgoing.numel())
        else:
            self._outgoing = encode_shards(contribution, self._layout)
            self._incoming = torch.empty_like(self._outgoing)
            self._gathered = torch.empty_like(self._outgoing)
        self._turn = (order if order is not None else IssueOrder()).take(self._first)

    def total(self) -> torch.Tensor:
        """The float32 sum, shaped like the contribution (once `future` completed)."""
        if self.exchange is Exchange.ALLGATHER:
            size = self._outgoing.numel()  # sliced, not viewed: also right when it is 0
            rows = [self._received[j * size : (j + 1) * size] for j in range(self._pg_size)]
            flat = sum_encoded(rows, self._numel, self._scheme)
        else:
            flat = decode_shards(self._gathered, self._layout)
        return flat.view(self._shape)

    def abandon(self) -> bool:
        """Issue nothing more and give up the turn; True if some collective of the
        sum was never issued (the other members may have issued it: a later
        collective of this member would meet theirs in its place)."""
        with self._lock:
            self._abandoned = True
            issued_all = self._issued_all
        self._turn.release()  # or cancel, if it has not started
        return not issued_all

    # -- the stages ----------------------------------------------------------------
    def _first(self, turn: Turn) -> None:
        self._turn = turn  # also when it runs inside `take`, before __init__ stored it
        error: Exception | None = None
        work: Work | None = None
        with self._lock:
            if self._abandoned:
                return
            try:
                if not turn.inline and not self._proceed():
                    raise ProcessGroupAbortedError(
                        "quantized allreduce given up before its turn came: the group "
                        "broke or the step ended"
                    )
                if self.exchange is Exchange.ALLGATHER:
                    work = self._pg.allgather_into_tensor_coalesced(
                        [self._received], [self._outgoing], AllgatherOptions()
                    )
                    self._issued_all = True
                else:
                    work = self._pg.alltoall_base(
                        self._incoming, self._outgoing, [], [], AllToAllOptions()
                    )
            except Exception as e:
                error = e
        # Futures are chained, and the turn released, outside the lock: a callback
        # may run here and now (a work that is already done), and `abandon` with it.
        if error is not None:
            turn.release()
            self._settle(error)
            return
        assert work is not None
        if self.exchange is Exchange.ALLGATHER:
            turn.release()
            work.get_future().add_done_callback(self._finished)
        else:
            work.get_future().add_done_callback(self._second)

    def _second(self, shards: Future[Any]) -> None:
        """The alltoall completed: sum this member's shards, allgather the sums."""
        error: Exception | None = None
        work: Work | None = None
        try:
            shards.value()
            reduced = reduce_shards(self._incoming, self._layout)
        except Exception as e:
            self._turn.release()
            self._settle(e)
            return
        with self._lock:
            if self._abandoned:
                return  # `abandon` released the turn
            try:
                if not self._proceed():
                    raise ProcessGroupAbortedError(
                        "quantized allreduce given up between its stages: the group "
                        "broke or the step ended"
                    )
                work = self._pg.allgather_into_tensor_coalesced(
                    [self._gathered], [reduced], AllgatherOptions()
                )
                self._issued_all = True
            except Exception as e:
                error = e
        self._turn.release()
        if error is not None:
            self._settle(error)
            return
        assert work is not None
        work.get_future().add_done_callback(self._finished)

    def _finished(self, last: Future[Any]) -> None:
        try:
            last.value()
        except Exception as e:
            self._settle(e)
            return
        self._settle(None)

    def _settle(self, error: Exception | None) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(None)


def quantized_sum(
    pg: ProcessGroup,
    contribution: torch.Tensor,
    scheme: Quantization,
    *,
    order: IssueOrder | None = None,
    exchange: Exchange | None = None,
) -> QuantizedSum:
    """Start a `QuantizedSum` of `contribution` over `pg` (see there)."""
    return QuantizedSum(pg, contribution, scheme, order=order, exchange=exchange)
