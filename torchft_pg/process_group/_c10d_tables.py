"""c10d's group tables, made to answer for our groups live and without keeping them alive.

`torch.distributed` keeps module-level dicts keyed by group: the rank table
(global rank -> group rank) that every ``src=``/``dst=``/``get_rank(group=)``
call reads, the backend/store map that ``destroy_process_group`` checks, the
name and tag maps. A plain dict entry for one of our groups would be wrong
after the next ``configure`` (it renumbers ranks), would vanish when the
default group is destroyed (``clear()``), and would keep a group the user
dropped alive forever, with its sockets and child processes.

So each table is replaced, once, by a `LiveGroupTable`: a dict subclass that
keeps c10d's own entries as before and, for a torchft_pg group that has no
stored entry, computes the answer from the group itself at the time of the
lookup. Nothing is stored for our groups, so nothing is stale, nothing is
cleared away and nothing holds them. A registered group (see
`ProcessGroup.register`) has real entries in the name, tag and backend maps,
as any c10d group does; its rank table is always the live one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed.distributed_c10d as c10d

__all__ = ["drop_rank_table", "install", "is_ours", "is_registered"]

# Set by `install`: the class whose instances the tables answer for.
_OURS: type | None = None


def is_ours(key: object) -> bool:
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


def _install_table(name: str, describe: Callable[[Any], Any]) -> None:
    current = getattr(c10d, name)
    if isinstance(current, LiveGroupTable):
        return
    # c10d's `_world` properties read these module globals on every access.
    setattr(c10d, name, LiveGroupTable(current, describe))


def install(ours: type) -> None:
    """Make c10d's tables answer for instances of `ours` (idempotent).

    `ours` must provide ``_c10d_rank_table() -> dict[int, int]`` (global rank
    to group rank), ``_c10d_backend() -> str`` and ``_c10d_name() -> str``.
    """
    global _OURS
    _OURS = ours
    _install_table("_pg_group_ranks", lambda pg: pg._c10d_rank_table())
    _install_table("_pg_map", lambda pg: (pg._c10d_backend(), None))
    _install_table("_pg_names", lambda pg: pg._c10d_name())
    _install_table("_pg_backend_config", lambda pg: pg._c10d_backend())
    _install_table("_pg_to_tag", lambda pg: "")


def drop_rank_table(group: object) -> None:
    """Forget c10d's stored rank table for `group`, so its live one answers."""
    table: dict[Any, Any] = c10d._pg_group_ranks
    dict.pop(table, group, None)


def is_registered(group: object) -> bool:
    """Whether c10d holds a real (stored) entry for `group`: registered and not destroyed."""
    return dict.__contains__(c10d._pg_map, group)
