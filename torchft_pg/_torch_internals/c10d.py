"""Private c10d names read about groups, works and options (not the group tables).

Each function names the private torch name it reads and why torchft_pg needs it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions
from torch.futures import Future

from torchft_pg._torch_internals.names import PrivateName

__all__ = [
    "OLDER_OP_NAMES",
    "RELIED_ON",
    "AllgatherOptions",
    "c10d_group_name",
    "c10d_groups",
    "default_group_timeout",
    "resolve_group",
    "set_group_name",
    "set_timeout_of",
    "source_rank",
    "work_from_future",
]

_C10D = "torch.distributed.distributed_c10d"
_C = "torch._C._distributed_c10d"

# c10d's names for these ops before torch 2.7. Some builds bind only those, and
# some libraries still call them, so our groups answer to both.
OLDER_OP_NAMES: dict[str, str] = {
    "all_gather_single": "_allgather_base",
    "reduce_scatter_single": "_reduce_scatter_base",
}

RELIED_ON: tuple[PrivateName, ...] = (
    PrivateName(
        owner=_C,
        name="AllgatherOptions",
        use="the options of allgather; torch.distributed does not export it "
        "(re-exported here as AllgatherOptions)",
    ),
    PrivateName(
        owner=_C10D,
        name="_world",
        use="its pg_names lists every group and its c10d name (c10d_groups, c10d_group_name)",
    ),
    PrivateName(
        owner=_C10D,
        name="_resolve_process_group",
        use="the group c10d knows by a name a DTensor layout was sent with (resolve_group)",
    ),
    PrivateName(
        owner="torch.distributed.ProcessGroup",
        name="_set_group_name",
        use="a registered group's c10d name, set on the group (set_group_name)",
    ),
    PrivateName(
        owner="torch.distributed.ProcessGroup",
        name="_get_backend",
        use="the default group's backend for a device, for its timeout (default_group_timeout)",
    ),
    PrivateName(
        owner=f"{_C}.Backend.Options",
        name="_timeout",
        use="a backend's op timeout: read (default_group_timeout) and set before it is "
        "built (gloo_options, set_options_timeout)",
    ),
    PrivateName(
        owner=_C,
        name="_create_work_from_future",
        use="a c10d Work completed by a Future (work_from_future)",
    ),
    PrivateName(
        owner="torch.distributed.Work",
        name="_source_rank",
        use="the sender of a completed recv_anysource: read (source_rank), and "
        "overridden by our works, since dist.recv calls it on them",
    ),
    PrivateName(
        owner="torch.distributed.ProcessGroupGloo",
        name="_set_default_timeout",
        use="a backend's timeout on a torch whose backend has no set_timeout (set_timeout_of)",
    ),
    *(
        PrivateName(
            owner="torch.distributed.ProcessGroup",
            name=older,
            use=f"the name of {op} before torch 2.7: called on a backend that lacks "
            "the new one (OLDER_OP_NAMES), and defined by our groups for callers that use it",
        )
        for op, older in OLDER_OP_NAMES.items()
    ),
)


def c10d_groups() -> list[Any]:
    """Every process group c10d knows in this process (``_world.pg_names``), in
    creation order."""
    from torch.distributed.distributed_c10d import _world

    return list(_world.pg_names)


def c10d_group_name(group: Any) -> str:
    """The name c10d gave `group` when it was created (``_world.pg_names[group]``).

    With a backend factory that returns a ProcessGroup, c10d keeps the name only
    in this table; `ProcessGroup.register` reads it to name our group the same.
    """
    from torch.distributed.distributed_c10d import _world

    name: str = _world.pg_names[group]
    return name


def resolve_group(name: str) -> Any | None:
    """The group c10d knows by `name` (``_resolve_process_group``), or None.

    A DTensor layout is sent with its mesh's group names; the receiver finds
    its own group of that name this way.
    """
    from torch.distributed.distributed_c10d import GroupName, _resolve_process_group

    try:
        return _resolve_process_group(GroupName(name))
    except RuntimeError:  # no group of that name in this process
        return None


def set_group_name(group: dist.ProcessGroup, name: str) -> None:
    """Set the c10d name of `group` (``ProcessGroup._set_group_name``): what
    ``group.group_name`` answers in C++, e.g. to functional collectives."""
    from torch.distributed.distributed_c10d import GroupName

    group._set_group_name(GroupName(name))


def default_group_timeout() -> timedelta | None:
    """The op timeout of this process's default group (its backend's
    ``options._timeout``, found through ``ProcessGroup._get_backend``), or None
    without a default group or a backend that says."""
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


def work_from_future(future: Future[Any]) -> dist.Work:
    """A c10d Work that completes with `future` (``_create_work_from_future``):
    what a group returns for an op whose result is a Future of our own."""
    from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
        _create_work_from_future,
    )

    work: dist.Work = _create_work_from_future(future)
    return work


def source_rank(work: dist.Work) -> int:
    """The sender of a completed ``recv_anysource`` (``Work._source_rank``), as
    ``dist.recv`` reads it."""
    return int(work._source_rank())


def set_timeout_of(group: Any, timeout: timedelta) -> None:
    """Set the op timeout of a c10d group or backend: ``set_timeout``, else
    ``_set_default_timeout`` (the name on a torch whose backend lacks the
    public one); nothing when it has neither."""
    setter = getattr(group, "set_timeout", None) or getattr(group, "_set_default_timeout", None)
    if setter is not None:
        setter(timeout)
