"""The private parts of torch.distributed this package reads, in one place.

Checked on torch 2.13.0. Each function says which private name it reads; if a
torch upgrade removes one, `tests/unit/test_torch_internals.py` fails naming
it, instead of a heal or a warning failing somewhere later.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["c10d_groups", "default_group_timeout"]


def c10d_groups() -> list[Any]:
    """Every process group c10d knows in this process (``_world.pg_names``), in
    creation order."""
    from torch.distributed.distributed_c10d import _world

    return list(_world.pg_names)


def default_group_timeout() -> timedelta | None:
    """The op timeout of this process's default group (its backend's
    ``options._timeout``), or None without a default group or a backend that
    says."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    group = dist.group.WORLD
    if group is None:
        return None
    for device in ("cpu", "cuda"):
        try:
            backend = group._get_backend(torch.device(device))
            timeout = backend.options._timeout
        except (RuntimeError, AttributeError, ValueError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None
