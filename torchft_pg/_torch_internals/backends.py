"""Private c10d names read to assemble a c10d group around a backend we built.

Our groups build their Gloo, NCCL or XCCL backend themselves (with their own
store, options and timeout) instead of through ``init_process_group``; c10d
offers no public way to put such a backend behind a ``ProcessGroup``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchft_pg._torch_internals.names import PrivateName

__all__ = [
    "RELIED_ON",
    "c10d_group_over",
    "gloo_options",
    "set_options_timeout",
    "start_sequence_numbers",
]

_GLOO = "torch.distributed.ProcessGroupGloo"

RELIED_ON: tuple[PrivateName, ...] = (
    PrivateName(
        owner="torch.distributed.ProcessGroup",
        name="_register_backend",
        use="puts our backend behind a c10d group for a device (c10d_group_over)",
    ),
    PrivateName(
        owner="torch.distributed.ProcessGroup",
        name="_set_default_backend",
        use="makes that backend the group's default (c10d_group_over)",
    ),
    PrivateName(
        owner="torch._C._distributed_c10d.Backend",
        name="_set_sequence_number_for_group",
        use="starts a fresh backend's collective sequence numbers, as c10d does for "
        "the groups it builds (start_sequence_numbers)",
    ),
    PrivateName(
        owner=_GLOO,
        name="_Options",
        use="Gloo's options, the only way to give it the devices (address) it binds (gloo_options)",
    ),
    PrivateName(
        owner=f"{_GLOO}._Options",
        name="_devices",
        use="the devices a Gloo backend binds and advertises (gloo_options)",
    ),
)


def start_sequence_numbers(backend: Any) -> None:
    """Start `backend`'s collective sequence numbers
    (``Backend._set_sequence_number_for_group``), as c10d does for a backend it
    builds; before the backend's first op."""
    backend._set_sequence_number_for_group()


def c10d_group_over(
    store: dist.Store,
    rank: int,
    world_size: int,
    backend: Any,
    backend_type: Any,
    devices: Sequence[str],
) -> dist.ProcessGroup:
    """A c10d group whose ops on each of `devices` run on `backend`, its default
    (``ProcessGroup._register_backend``, ``ProcessGroup._set_default_backend``).

    `backend_type` is a ``ProcessGroup.BackendType``.
    """
    group = dist.ProcessGroup(store, rank, world_size)
    for device in devices:
        group._register_backend(torch.device(device), backend_type, backend)
    group._set_default_backend(backend_type)
    return group


def gloo_options(timeout: timedelta, device: Any) -> Any:
    """Gloo's options (``ProcessGroupGloo._Options``) with `timeout` and the one
    `device` (from ``ProcessGroupGloo.create_device``) to bind: Gloo's public
    constructor takes only a timeout."""
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timeout
    options._devices = [device]
    return options


def set_options_timeout(options: Any, timeout: timedelta, *, required: bool = True) -> bool:
    """Set a backend's `options` timeout (``Backend.Options._timeout``) before it
    is built; True when set.

    Options without one raise RuntimeError naming it when `required`, else
    return False (a backend whose own default timeout is acceptable).
    """
    if not hasattr(options, "_timeout"):
        if not required:
            return False
        from torchft_pg._torch_internals import checked_versions_note

        raise RuntimeError(
            f"{type(options).__qualname__} has no _timeout, which torchft_pg sets before "
            f"building the backend; {checked_versions_note()}"
        )
    options._timeout = timeout
    return True
