"""Manager settings and the only place that reads environment variables.

Each setting: its environment variable, unit and default.
- lighthouse_addr  TORCHFT_LIGHTHOUSE     ``host:port`` of the lighthouse (group rank 0 needs it)
- rank             RANK                   group rank inside this replica group (default 0)
- world_size       WORLD_SIZE             ranks in this replica group (default 1)
- store_addr       MASTER_ADDR            host of the replica group's TCPStore (default localhost)
- store_port       MASTER_PORT            port of that TCPStore (required)
- replica_id       REPLICA_GROUP_ID       this replica group's name (default: "replica")
- port             TORCHFT_MANAGER_PORT   manager server port on group rank 0 (default 0: any)
- hostname         TORCHFT_HOSTNAME       address other machines use to reach this rank's manager
                                          and checkpoint servers (default: the machine's hostname
                                          for the manager server, loopback-safe for checkpoints)
- bind_host        TORCHFT_BIND_HOST      the address this rank's manager server (group rank 0) and
                                          checkpoint server listen on, e.g. 127.0.0.1 for a job on
                                          one machine or one interface's address (default: every
                                          interface, ``::`` and ``0.0.0.0``, so other machines can
                                          heal from it)
Explicit constructor arguments win over the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ManagerConfig"]


@dataclass(frozen=True)
class ManagerConfig:
    """Where this rank sits and whom it talks to (see the module docstring)."""

    lighthouse_addr: str | None
    rank: int
    world_size: int
    store_addr: str
    store_port: int
    replica_id: str
    port: int
    hostname: str | None = None
    bind_host: str | None = None  # None: every interface (see the module docstring)

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        lighthouse_addr: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        store_addr: str | None = None,
        store_port: int | None = None,
        replica_id: str | None = None,
        port: int | None = None,
        hostname: str | None = None,
        bind_host: str | None = None,
    ) -> ManagerConfig:
        """Fill every argument left as None from `env` (default: os.environ)."""
        env = os.environ if env is None else env

        def integer(name: str, value: int | None, default: int | None) -> int:
            if value is not None:
                return value
            text = env.get(name)
            if text is None:
                if default is None:
                    raise ValueError(f"{name} is not set and no value was passed; it is required")
                return default
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {text!r}") from None

        config = cls(
            lighthouse_addr=lighthouse_addr
            if lighthouse_addr is not None
            else env.get("TORCHFT_LIGHTHOUSE"),
            rank=integer("RANK", rank, 0),
            world_size=integer("WORLD_SIZE", world_size, 1),
            store_addr=store_addr
            if store_addr is not None
            else env.get("MASTER_ADDR", "localhost"),
            store_port=integer("MASTER_PORT", store_port, None),
            replica_id=replica_id
            if replica_id is not None
            else env.get("REPLICA_GROUP_ID", "replica"),
            port=integer("TORCHFT_MANAGER_PORT", port, 0),
            hostname=hostname if hostname is not None else env.get("TORCHFT_HOSTNAME") or None,
            bind_host=bind_host if bind_host is not None else env.get("TORCHFT_BIND_HOST") or None,
        )
        config.validate()
        return config

    def validate(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if not 0 < self.store_port < 65536:
            raise ValueError(f"store_port must be in [1, 65535], got {self.store_port}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.bind_host is not None and (
            not self.bind_host or self.bind_host != self.bind_host.strip("[] ")
        ):
            raise ValueError(
                f"bind_host must be a host or address without brackets or port, e.g. "
                f"127.0.0.1 or ::, got {self.bind_host!r}"
            )
        if self.rank == 0 and not self.lighthouse_addr:
            raise ValueError(
                "group rank 0 needs the lighthouse address: pass lighthouse_addr= or set TORCHFT_LIGHTHOUSE"
            )
