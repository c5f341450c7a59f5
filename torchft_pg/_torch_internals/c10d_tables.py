"""c10d's group tables, made to answer for our groups live and without keeping them alive.

`torch.distributed` keeps module-level dicts keyed by group: the rank table
(global rank -> group rank) that every ``src=``/``dst=``/``get_rank(group=)``
call reads, the backend/store map that ``destroy_process_group`` checks, the
name and tag maps. A plain dict entry for one of our groups would be wrong
after the next ``configure`` (it renumbers ranks), would vanish when the
default group is destroyed (``clear()``), and would keep a group the user
dropped alive forever, with its sockets and child processes.

So each table is replaced by a `LiveGroupTable`: a dict subclass that keeps
c10d's own entries as before and, for a torchft_pg group that has no stored
entry, computes the answer from the group itself at the time of the lookup.
Nothing is stored for our groups, so nothing is stale, nothing is cleared away
and nothing holds them. A registered group (see `ProcessGroup.register`) has
real entries in the name, tag and backend maps, as any c10d group does; its
rank table is always the live one.

The tables are replaced on first use, not at import: `answer_for` is called by
the constructor of our process group base class, so a process that never
builds one of our groups keeps torch's tables untouched. c10d's ``_world``
properties read the module globals on every access, so replacing a global is
seen everywhere at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed.distributed_c10d as c10d

from torchft_pg._torch_internals.names import PrivateName

__all__ = [
    "RELIED_ON",
    "LiveGroupTable",
    "answer_for",
    "drop_rank_table",
    "is_ours",
    "is_registered",
    "tables_answer_for_ours",
]

logger = logging.getLogger(__name__)

_C10D = "torch.distributed.distributed_c10d"

# c10d's table (a module global of distributed_c10d) -> what it holds for one of our groups.
_TABLES: dict[str, Callable[[Any], Any]] = {
    "_pg_group_ranks": lambda pg: pg._c10d_rank_table(),
    "_pg_map": lambda pg: (pg._c10d_backend(), None),
    "_pg_names": lambda pg: pg._c10d_name(),
    "_pg_backend_config": lambda pg: pg._c10d_backend(),
    "_pg_to_tag": lambda pg: "",
}

RELIED_ON: tuple[PrivateName, ...] = tuple(
    PrivateName(
        owner=_C10D,
        name=table,
        use="a group table c10d reads through _world; replaced by a LiveGroupTable "
        "when the first of our groups is constructed (`answer_for`)",
    )
    for table in _TABLES
)

# Set by `answer_for`, after every table is replaced: the class whose instances they answer for.
_OURS: type | None = None
_install_lock = threading.Lock()


def is_ours(key: object) -> bool:
    """Whether `key` is one of our groups (an instance of the class given to `answer_for`)."""
    return _OURS is not None and isinstance(key, _OURS)


class LiveGroupTable(dict):  # type: ignore[type-arg]
    """A c10d table whose entries for torchft_pg groups are computed on lookup.

    `describe(group)` gives the entry. A group c10d itself created through a
    backend factory has stored entries, which win.
    """

    def __init__(self, entries: dict[Any, Any], describe: Callable[[Any], Any]) -> None:
        super().__init__(entries)
        self._describe = describe

    def _computed(self, key: object) -> bool:
        return is_ours(key) and not dict.__contains__(self, key)

    def __getitem__(self, key: Any) -> Any:
        if self._computed(key):
            return self._describe(key)
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        return is_ours(key) or dict.__contains__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        if self._computed(key):
            return self._describe(key)
        return dict.get(self, key, default)

    def __delitem__(self, key: Any) -> None:
        if self._computed(key):
            return
        dict.__delitem__(self, key)

    _MISSING = object()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if self._computed(key):
            return self._describe(key)
        if default is LiveGroupTable._MISSING:
            return dict.pop(self, key)
        return dict.pop(self, key, default)


def _table(name: str) -> dict[Any, Any]:
    """c10d's module global `name`, with an error naming it if this torch has none."""
    try:
        table: dict[Any, Any] = getattr(c10d, name)
    except AttributeError:
        from torchft_pg._torch_internals import checked_versions_note

        raise RuntimeError(
            f"torch.distributed.distributed_c10d has no {name}, the group table torchft_pg "
            f"answers for its groups; {checked_versions_note()}"
        ) from None
    return table


def answer_for(ours: type) -> None:
    """Make c10d's tables answer for instances of `ours`, once per process.

    Idempotent and thread-safe: the first call replaces each table by a
    `LiveGroupTable` holding its current entries; later calls return at once.
    `ours` must provide ``_c10d_rank_table() -> dict[int, int]`` (global rank
    to group rank), ``_c10d_backend() -> str`` and ``_c10d_name() -> str``;
    it must be the same class on every call.
    """
    global _OURS
    if _OURS is ours:
        return
    with _install_lock:
        if _OURS is not None:
            if _OURS is not ours:
                raise RuntimeError(
                    f"c10d's tables already answer for {_OURS.__qualname__}, not {ours.__qualname__}"
                )
            return
        from torchft_pg._torch_internals import unchecked_torch

        unchecked = unchecked_torch()
        if unchecked is not None:
            logger.warning("replacing c10d's group tables: %s", unchecked)
        for name, describe in _TABLES.items():
            current = _table(name)
            if not isinstance(current, LiveGroupTable):
                setattr(c10d, name, LiveGroupTable(current, describe))
        _OURS = ours  # last: a caller that sees it set sees every table replaced


def tables_answer_for_ours() -> bool:
    """Whether every c10d table is a `LiveGroupTable` (`answer_for` has run)."""
    return all(isinstance(getattr(c10d, name, None), LiveGroupTable) for name in _TABLES)


def drop_rank_table(group: object) -> None:
    """Forget c10d's stored rank table for `group`, so its live one answers."""
    dict.pop(_table("_pg_group_ranks"), group, None)


def is_registered(group: object) -> bool:
    """Whether c10d holds a real (stored) entry for `group`: registered and not destroyed."""
    return dict.__contains__(_table("_pg_map"), group)
