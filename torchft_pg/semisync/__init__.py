"""Semi-synchronous training across replica groups: LocalSGD and (Streaming) DiLoCo.

Replica groups take several optimizer steps alone and sync only every few
steps, through the Manager (quorum, allreduce, commit vote), so they exchange
parameters or pseudo-gradients once per window instead of gradients every
step. The public names are also importable from `torchft_pg.local_sgd`
(torchft's module path).
"""

from __future__ import annotations

from torchft_pg.semisync._tensors import extract_local_tensor
from torchft_pg.semisync.diloco import DiLoCo
from torchft_pg.semisync.local_sgd import LocalSGD

__all__ = ["DiLoCo", "LocalSGD", "extract_local_tensor"]
