"""How the ranks of one replica group find their manager server.

Group rank 0 starts the `ManagerServer` (under a fresh replica id: a restarted
group is a new member) and publishes its address and that id in the group's
TCPStore under torchft's keys (`MANAGER_ADDR_KEY`, `REPLICA_ID_KEY`); every
rank reads them there. Rank 0 then talks to its own server in-process
(`LocalManagerClient`), the others over gRPC.

Under torchrun the keys are scoped to the launcher's incarnation
(`group_key`): torchrun's store outlives a restart of its workers
(``--max-restarts``), and a restarted rank that read the previous
incarnation's address retried a dead server for a minute. A store that does
not answer fails within `STORE_CONNECT_S`, naming ``MASTER_ADDR:MASTER_PORT``.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
import uuid
from datetime import timedelta

from torch.distributed import TCPStore

from lighthouse import (
    LocalManagerClient,
    ManagerClient,
    ManagerClientProtocol,
    ManagerServer,
    auth,
    exposure,
)
from torchft_pg.manager.config import ManagerConfig

__all__ = [
    "MANAGER_ADDR_KEY",
    "REPLICA_ID_KEY",
    "advertised_store_addr",
    "connect_replica_group",
    "group_key",
    "manager_bind",
    "open_group_store",
]

#: Group-store key where rank 0 publishes its manager server's address.
MANAGER_ADDR_KEY = "manager_addr"
#: Group-store key where rank 0 publishes the group's replica id (with its incarnation suffix).
REPLICA_ID_KEY = "replica_id"
#: The longest wait for the group's store to answer at all (s), before the error names it.
STORE_CONNECT_S = 5.0


def group_key(config: ManagerConfig, key: str) -> str:
    """`key` as this group writes it in its store: scoped to the launcher's
    incarnation under torchrun, torchft's plain key otherwise."""
    return key if config.incarnation is None else f"torchft_pg/{config.incarnation}/{key}"


def open_group_store(config: ManagerConfig, connect_timeout: timedelta) -> TCPStore:
    """A client of the replica group's store (``MASTER_ADDR:MASTER_PORT``). Something
    must accept connections there within `STORE_CONNECT_S` (or `connect_timeout`
    if shorter), else a ConnectionError names the address and the variables (at
    once if the host does not resolve: that is not transient); the client's own
    handshake and its waits for rank 0's keys are bounded by `connect_timeout`."""
    first = min(connect_timeout, timedelta(seconds=STORE_CONNECT_S))
    where = f"{config.store_addr}:{config.store_port}"
    hint = (
        "start the group with torchrun (which hosts it) or start a TCPStore there first, "
        "and check MASTER_ADDR:MASTER_PORT (or the Manager's store_addr/store_port)"
    )
    # A plain connect first: c10d's client would print a stack trace per retry.
    deadline = time.monotonic() + first.total_seconds()
    pause = threading.Event()
    while True:
        try:
            socket.create_connection((config.store_addr, config.store_port), timeout=1.0).close()
            break
        except socket.gaierror as e:
            raise ConnectionError(
                f"the replica group's store host {config.store_addr!r} does not resolve ({e}): {hint}"
            ) from e
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"nothing answers at the replica group's store, {where}, after "
                    f"{first.total_seconds():g} s ({e}): {hint}"
                ) from e
            pause.wait(0.2)  # the store may be starting (a launcher starts it first)
    # Something listens: the client's own connect and handshake get the whole
    # connect_timeout (a busy store answers slowly, but it answers).
    return TCPStore(
        config.store_addr,
        config.store_port,
        is_master=False,
        timeout=connect_timeout,
        wait_for_workers=False,
    )


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def advertised_store_addr(store_addr: str, store_port: int, hostname: str | None) -> str:
    """``host:port`` of the group's store as the other replica groups must reach it.

    The lighthouse hands it to them as the cross-replica rendezvous store. A
    loopback store host (``MASTER_ADDR=localhost``, as ``torchrun --standalone``
    sets it) means this machine to our own ranks only, so it is replaced by
    `hostname` (the address this rank advertises) when one is given; the
    store's server listens on every interface.
    """
    host = hostname if hostname and _is_loopback(store_addr) else store_addr
    return f"{host}:{store_port}"


def manager_bind(config: ManagerConfig, job_secret: str | None = None) -> str:
    """The manager server's listen address, ``host:port``: `config.bind_host` and
    `config.port`. With no bind host: every interface if the job has a secret
    (`job_secret`, else the environment's) or ``TORCHFT_INSECURE`` is set, else
    loopback (``lighthouse.exposure``)."""
    host = config.bind_host or exposure.default_host(
        auth.resolve_job_secret(job_secret), exposure.insecure_opted_out()
    )
    return f"[{host}]:{config.port}" if ":" in host else f"{host}:{config.port}"


def connect_replica_group(
    config: ManagerConfig,
    hostname: str | None,
    heartbeat_interval: timedelta | None,
    connect_timeout: timedelta,
    quorum_retries: int,
) -> tuple[ManagerClientProtocol, str, ManagerServer | None]:
    """Return (this rank's manager client, the group's replica id, the server if rank 0).

    `connect_timeout` bounds reaching the group store, the lighthouse and the
    server; `heartbeat_interval` is the server's liveness ping period (None: derived from
    the lighthouse's heartbeat timeout, see `ManagerServer`).
    """
    store = open_group_store(config, connect_timeout)
    addr_key, id_key = group_key(config, MANAGER_ADDR_KEY), group_key(config, REPLICA_ID_KEY)
    server: ManagerServer | None = None
    if config.rank == 0:
        full_id = f"{config.replica_id}:{uuid.uuid4().hex[:12]}"
        assert config.lighthouse_addr is not None  # ManagerConfig.validate guarantees it
        server = ManagerServer(
            full_id,
            config.lighthouse_addr,
            hostname=hostname,
            bind=manager_bind(config),
            store_addr=advertised_store_addr(config.store_addr, config.store_port, hostname),
            world_size=config.world_size,
            heartbeat_interval=heartbeat_interval,
            connect_timeout=connect_timeout,
            quorum_retries=quorum_retries,
        )
        store.set(addr_key, server.address())
        store.set(id_key, full_id)
    addr = store.get(addr_key).decode()
    full_id = store.get(id_key).decode()
    if server is not None:  # rank 0 calls its own server without gRPC
        return LocalManagerClient(server, addr, connect_timeout), full_id, server
    return ManagerClient(addr, connect_timeout), full_id, None
