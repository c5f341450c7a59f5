"""Every private part of torch this package reads, in one place.

Checked on the torch versions in `CHECKED_TORCH_VERSIONS`. No other module of
torchft_pg imports ``torch._C`` or reads a torch name that starts with ``_``:
they call the functions here, each of which says which private name it reads
and why. Each module lists its names in ``RELIED_ON``; `PRIVATE_NAMES` is all
of them, and one test resolves every one against the installed torch and
fails naming the missing ones and the versions checked, instead of a heal or
a collective failing obscurely later.

Importing this package changes nothing in torch. The one change it makes to
torch's state, c10d's group tables answering for our groups
(`c10d_tables.answer_for`), is made when the first of our groups is
constructed.

Modules, by concern: `c10d_tables` (c10d's group tables), `c10d` (groups,
works and options), `backends` (a c10d group around a backend we built),
`tensors` (shared-memory storages, DTensors, meshes), `ddp` (a new reducer
for a DistributedDataParallel module), `names` (the record of one private
name).
"""

from __future__ import annotations

import torch

from torchft_pg._torch_internals import backends, c10d, c10d_tables, ddp, tensors
from torchft_pg._torch_internals.backends import (
    c10d_group_over,
    gloo_options,
    set_options_timeout,
    start_sequence_numbers,
)
from torchft_pg._torch_internals.c10d import (
    OLDER_OP_NAMES,
    AllgatherOptions,
    c10d_group_name,
    c10d_groups,
    default_group_timeout,
    resolve_group,
    set_group_name,
    set_timeout_of,
    source_rank,
    work_from_future,
)
from torchft_pg._torch_internals.c10d_tables import (
    answer_for,
    drop_rank_table,
    is_ours,
    is_registered,
    tables_answer_for_ours,
)
from torchft_pg._torch_internals.ddp import rebuild_reducer
from torchft_pg._torch_internals.names import PrivateName
from torchft_pg._torch_internals.tensors import (
    dtensor_like,
    root_mesh,
    share_storage_fd,
    storage_from_fd,
    strided_shard_type,
)

__all__ = [
    "CHECKED_TORCH_VERSIONS",
    "OLDER_OP_NAMES",
    "PRIVATE_NAMES",
    "AllgatherOptions",
    "PrivateName",
    "answer_for",
    "c10d_group_name",
    "c10d_group_over",
    "c10d_groups",
    "checked_versions_note",
    "default_group_timeout",
    "drop_rank_table",
    "dtensor_like",
    "gloo_options",
    "is_ours",
    "is_registered",
    "rebuild_reducer",
    "resolve_group",
    "root_mesh",
    "set_group_name",
    "set_options_timeout",
    "set_timeout_of",
    "share_storage_fd",
    "source_rank",
    "start_sequence_numbers",
    "storage_from_fd",
    "strided_shard_type",
    "tables_answer_for_ours",
    "torch_release",
    "unchecked_torch",
    "work_from_future",
]

# The torch releases on which every name in PRIVATE_NAMES was found and the
# code here was run. Add a release only once both hold on it.
CHECKED_TORCH_VERSIONS: tuple[str, ...] = ("2.13.0",)

PRIVATE_NAMES: tuple[PrivateName, ...] = (
    *c10d_tables.RELIED_ON,
    *c10d.RELIED_ON,
    *backends.RELIED_ON,
    *tensors.RELIED_ON,
    *ddp.RELIED_ON,
)


def torch_release(version: str | None = None) -> str:
    """The release of `version` (default: the installed torch's) without a local
    build tag: ``"2.13.0+cpu"`` -> ``"2.13.0"``."""
    return (version if version is not None else torch.__version__).split("+")[0]


def checked_versions_note(version: str | None = None) -> str:
    """A sentence naming the torch releases these internals were checked on and
    `version` (default: the installed torch's)."""
    running = version if version is not None else torch.__version__
    checked = ", ".join(CHECKED_TORCH_VERSIONS)
    return f"torchft_pg's use of torch internals was checked on torch {checked}; this is torch {running}"


def unchecked_torch(version: str | None = None) -> str | None:
    """None when `version` (default: the installed torch's) is a checked
    release, else `checked_versions_note` for it."""
    if torch_release(version) in CHECKED_TORCH_VERSIONS:
        return None
    return checked_versions_note(version)
