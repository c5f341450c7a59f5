"""How the ranks of one replica group find their manager server.

Group rank 0 starts the `ManagerServer` (under a fresh replica id: a restarted
group is a new member) and publishes its address in the group's TCPStore;
every rank reads it there. Rank 0 then talks to its own server in-process
(`LocalManagerClient`), the others over gRPC.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from torch.distributed import PrefixStore, TCPStore

from lighthouse import ManagerClient, ManagerServer
from lighthouse.local import LocalManagerClient
from torchft_pg.config import ManagerConfig

__all__ = ["MANAGER_KEY_PREFIX", "connect_replica_group"]

MANAGER_KEY_PREFIX = "torchft_pg/manager"


def connect_replica_group(
    config: ManagerConfig,
    hostname: str | None,
    heartbeat_interval: timedelta,
    connect_timeout: timedelta,
    quorum_retries: int,
) -> tuple[Any, str, ManagerServer | None]:
    """Return (this rank's manager client, the group's replica id, the server if rank 0).

    `connect_timeout` bounds reaching the group store, the lighthouse and the
    server; `heartbeat_interval` is the server's liveness ping period.
    """
    store = PrefixStore(
        MANAGER_KEY_PREFIX,
        TCPStore(
            config.store_addr,
            config.store_port,
            is_master=False,
            timeout=connect_timeout,
            wait_for_workers=False,
        ),
    )
    server: ManagerServer | None = None
    if config.rank == 0:
        full_id = f"{config.replica_id}:{uuid.uuid4().hex[:12]}"
        assert config.lighthouse_addr is not None  # ManagerConfig.validate guarantees it
        server = ManagerServer(
            full_id,
            config.lighthouse_addr,
            hostname=hostname,
            bind=f"[::]:{config.port}",
            store_addr=f"{config.store_addr}:{config.store_port}",
            world_size=config.world_size,
            heartbeat_interval=heartbeat_interval,
            connect_timeout=connect_timeout,
            quorum_retries=quorum_retries,
        )
        store.set("manager_addr", server.address())
        store.set("replica_id", full_id)
    addr = store.get("manager_addr").decode()
    full_id = store.get("replica_id").decode()
    if server is not None:  # rank 0 calls its own server without gRPC
        return LocalManagerClient(server, addr, connect_timeout), full_id, server
    return ManagerClient(addr, connect_timeout), full_id, None
