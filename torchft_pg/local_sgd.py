"""LocalSGD and DiLoCo under torchft's module path (``torchft.local_sgd``).

The implementation lives in `torchft_pg.semisync`.
"""

from __future__ import annotations

from torchft_pg.semisync import DiLoCo, LocalSGD, extract_local_tensor

__all__ = ["DiLoCo", "LocalSGD", "extract_local_tensor"]
