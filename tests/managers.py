"""A one-rank replica group's `Manager` for tests that drive quorum rounds without
collectives (a `ProcessGroupDummy`), each on its own store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore

from torchft_pg import ProcessGroupDummy
from torchft_pg.manager import Manager


@contextmanager
def solo_manager(
    lighthouse_addr: str,
    replica_id: str,
    quorum_timeout: timedelta = timedelta(seconds=20),
    **kwargs: Any,
) -> Iterator[Manager]:
    """A Manager of one rank (`min_replica_size=1` and no initial sync unless
    `kwargs` say otherwise) on a fresh TCPStore, shut down on exit; `kwargs` go
    to the Manager."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    kwargs.setdefault("min_replica_size", 1)
    kwargs.setdefault("init_sync", False)
    manager = Manager(
        ProcessGroupDummy(),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse_addr,
        replica_id=replica_id,
        quorum_timeout=quorum_timeout,
        **kwargs,
    )
    try:
        yield manager
    finally:
        manager.shutdown()
