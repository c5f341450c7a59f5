"""A process group that sums float32 allreduces in float64, so the result does not depend on order.

DiLoCo hands its float32 pseudo-gradients to ``Manager.allreduce``, which
sums them on the process group. A float32 sum depends on the order the
backend adds in, which changes with every quorum, so a replay could not
follow the replicas bit for bit. Summed in float64 and rounded once back to
float32, a few float32 values give the same bits in any order (short of
values 2**29 apart), the same argument as `workload.REDUCE_DTYPE` for DDP.
The chaos DiLoCo trainer wraps its group in this one; the replay sums the
same way (`diloco_oracle.average`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C._distributed_c10d import AllreduceOptions, ReduceOp, Work

from torchft_pg.process_group import ProcessGroup, ProcessGroupWrapper
from torchft_pg.process_group._staging import Staging, staged_work

__all__ = ["ExactSumProcessGroup"]


class ExactSumProcessGroup(ProcessGroupWrapper):
    """Wraps `pg`: a SUM allreduce of float32 tensors runs on float64 copies,
    copied back (rounded once) when it completes. Everything else passes through."""

    def __init__(self, pg: ProcessGroup) -> None:
        super().__init__(pg=pg)

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        if op != "allreduce":
            return super()._run(op, outputs, *args)
        tensors, options = args
        assert isinstance(options, AllreduceOptions)
        if options.reduceOp != ReduceOp.SUM or not all(t.dtype == torch.float32 for t in tensors):
            return super()._run(op, outputs, *args)
        wide = [t.to(torch.float64) for t in tensors]
        staging = Staging(
            args=(wide, options),
            outputs=wide,
            user_outputs=outputs,
            pairs=tuple(zip(tensors, wide, strict=True)),
        )
        return staged_work(super()._run(op, wide, wide, options), staging)
