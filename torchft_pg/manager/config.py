"""Manager settings and the only place that reads environment variables.

Each setting: its environment variable, unit and default.
- lighthouse_addr  TORCHFT_LIGHTHOUSE     ``host:port`` of the lighthouse (group rank 0 needs it);
                                         standbys after commas
- rank             RANK                   group rank inside this replica group (default 0)
- world_size       WORLD_SIZE             ranks in this replica group (default 1)
- store_addr       MASTER_ADDR            host of the replica group's TCPStore (default localhost)
- store_port       MASTER_PORT            port of that TCPStore (required)
- replica_id       REPLICA_GROUP_ID       this replica group's name (default: "replica")
- port             TORCHFT_MANAGER_PORT   manager server port on group rank 0 (default 0: any)
- hostname         TORCHFT_HOSTNAME       address other machines use to reach this rank's manager
                                          and checkpoint servers (default: the machine's hostname
                                          for the manager server, loopback-safe for checkpoints)
- incarnation      TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT (set by torchrun): scopes
                                          the keys a group writes in torchrun's store, which
                                          outlives a restart of its workers
- bind_host        TORCHFT_BIND_HOST      the address this rank's manager server (group rank 0) and
                                          checkpoint server listen on, e.g. one interface's address
                                          (default: every interface, ``::`` and ``0.0.0.0``, when
                                          the job has a secret, TORCHFT_JOB_SECRET; loopback when
                                          it has none. Beyond loopback without a secret is refused
                                          unless TORCHFT_INSECURE=1: see lighthouse.exposure)
Explicit constructor arguments win over the environment.

The Manager's timeouts follow torchft's precedence instead: each variable,
when set, overrides the constructor's argument (`ManagerTimeouts.resolve`).
- timeout          TORCHFT_TIMEOUT_SEC          s, each collective, heal transfer and vote (60)
- quorum_timeout   TORCHFT_QUORUM_TIMEOUT_SEC   s, one quorum round (60)
- connect_timeout  TORCHFT_CONNECT_TIMEOUT_SEC  s, reaching a server (60)
- quorum_retries   TORCHFT_QUORUM_RETRIES       lighthouse calls retried after a failure (0)
torchft's variables this library reads but has no counterpart for are named
in a warning at start (`unsupported_variables`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

__all__ = [
    "TIMEOUT_ENV",
    "ManagerConfig",
    "ManagerTimeouts",
    "check_lighthouse_address",
    "timeout_order_warnings",
    "unsupported_variables",
]

# Manager argument -> torchft's variable overriding it (in seconds).
TIMEOUT_ENV = {
    "timeout": "TORCHFT_TIMEOUT_SEC",
    "quorum_timeout": "TORCHFT_QUORUM_TIMEOUT_SEC",
    "connect_timeout": "TORCHFT_CONNECT_TIMEOUT_SEC",
}
QUORUM_RETRIES_ENV = "TORCHFT_QUORUM_RETRIES"

# torchft's variables with no counterpart here, and what to use instead.
_UNSUPPORTED = {
    "TORCHFT_USE_OTEL": "torchft_pg exports no OpenTelemetry logs; the lighthouse serves "
    "Prometheus metrics at /metrics and every quorum, commit and error on /status",
    "TORCHFT_OTEL_RESOURCE_ATTRIBUTES_JSON": "see TORCHFT_USE_OTEL",
    "TORCHFT_WATCHDOG_TIMEOUT_SEC": "torchft_pg's deadlines run on one thread that a stuck "
    "callback cannot hold up, so there is no watchdog to time",
}


def check_lighthouse_address(address: str, source: str) -> None:
    """ValueError naming `source` (the argument or variable it came from) unless
    `address` is ``host:port``, ``[v6]:port`` or either behind ``http://``, or
    several of them separated by commas (a lighthouse and its standbys)."""
    for part in address.split(","):
        bare = part.strip()
        for scheme in ("http://", "https://", "grpc://"):
            if bare.startswith(scheme):
                bare = bare[len(scheme) :]
        host, sep, port = bare.rstrip("/").rpartition(":")
        if not sep or not host or host == "[" or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{source} must be the lighthouse's host:port (or http://host:port; "
                f"standbys after commas), e.g. 127.0.0.1:29510, got {address!r}"
            )


def unsupported_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per torchft variable set in `env` that has no effect here."""
    env = os.environ if env is None else env
    return [
        f"{name} is set but has no effect: {why}"
        for name, why in _UNSUPPORTED.items()
        if name in env
    ]


def _seconds(where: str, value: object) -> timedelta:
    """`value` (a timedelta or a number of seconds) as a positive, finite timedelta."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where} must be a positive number of seconds, got {value!r}")
        return timedelta(seconds=value)
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise ValueError(f"{where} must be positive, got {value} ({value.total_seconds()} s)")
        return value
    raise TypeError(f"{where} must be a timedelta or a number of seconds, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ManagerTimeouts:
    """The Manager's timeouts and quorum retries, after torchft's variables."""

    timeout: timedelta
    quorum_timeout: timedelta
    connect_timeout: timedelta
    quorum_retries: int

    @classmethod
    def resolve(
        cls,
        *,
        timeout: timedelta | float,
        quorum_timeout: timedelta | float,
        connect_timeout: timedelta | float,
        quorum_retries: int,
        env: Mapping[str, str] | None = None,
    ) -> ManagerTimeouts:
        """Each of torchft's variables, when set in `env` (default: os.environ),
        overrides its argument (torchft's precedence). Raises ValueError or
        TypeError naming the argument or variable and what arrived."""
        env = os.environ if env is None else env
        given = {
            "timeout": timeout,
            "quorum_timeout": quorum_timeout,
            "connect_timeout": connect_timeout,
        }
        out: dict[str, timedelta] = {}
        for name, value in given.items():
            var = TIMEOUT_ENV[name]
            text = env.get(var)
            if text is None:
                out[name] = _seconds(f"Manager({name}=...)", value)
                continue
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"{var} must be a number of seconds, got {text!r}") from None
            out[name] = _seconds(var, seconds)
        retries_text = env.get(QUORUM_RETRIES_ENV)
        if retries_text is not None:
            try:
                quorum_retries = int(retries_text)
            except ValueError:
                raise ValueError(
                    f"{QUORUM_RETRIES_ENV} must be an integer >= 0, got {retries_text!r}"
                ) from None
            where = QUORUM_RETRIES_ENV
        else:
            where = "Manager(quorum_retries=...)"
        if (
            isinstance(quorum_retries, bool)
            or not isinstance(quorum_retries, int)
            or quorum_retries < 0
        ):
            raise ValueError(f"{where} must be an integer >= 0, got {quorum_retries!r}")
        return cls(quorum_retries=quorum_retries, **out)


def timeout_order_warnings(
    *,
    timeout: timedelta,
    quorum_timeout: timedelta,
    pg_timeout: timedelta | None,
    group_timeout: timedelta | None,
) -> list[str]:
    """Why these timeouts would make the wrong layer report a fault (one line each).

    `timeout`/`quorum_timeout`: the Manager's; `pg_timeout`: the fault-tolerant
    process group's own op timeout (None: unknown); `group_timeout`: the
    timeout of the replica group's own default process group (FSDP, TP inside
    the group; None: no default group).
    """
    out = []
    if pg_timeout is not None and pg_timeout > timeout:
        out.append(
            f"the process group's op timeout ({pg_timeout.total_seconds():g} s) exceeds the "
            f"Manager's timeout ({timeout.total_seconds():g} s): a stuck collective is "
            "abandoned by the Manager as a plain timeout before the process group reports "
            "which operation failed; give the process group the shorter timeout"
        )
    if group_timeout is not None:
        op = min(timeout, pg_timeout) if pg_timeout is not None else timeout
        bound = op + quorum_timeout
        if group_timeout <= bound:
            out.append(
                f"the replica group's own process group times out after "
                f"{group_timeout.total_seconds():g} s, within the "
                f"{op.total_seconds():g} s a cross-replica collective and the "
                f"{quorum_timeout.total_seconds():g} s a quorum may take: while a peer replica "
                "hangs, this group's ranks waiting on each other would be aborted by their own "
                "watchdog, a healthy group killed for another's fault; give the default group "
                f"more than {bound.total_seconds():g} s (init_process_group(timeout=...))"
            )
    return out


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
    bind_host: str | None = None  # None: every interface with a job secret, else loopback
    # The launcher's incarnation of this group (torchrun's TORCHELASTIC_RUN_ID and
    # TORCHELASTIC_RESTART_COUNT): torchrun's store outlives a restart of its workers,
    # so the keys a group writes there are scoped to it. None: not under torchrun.
    incarnation: str | None = None

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

        lighthouse_from = "lighthouse_addr" if lighthouse_addr is not None else "TORCHFT_LIGHTHOUSE"
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
            incarnation=(
                f"{env.get('TORCHELASTIC_RUN_ID', '')}/{env['TORCHELASTIC_RESTART_COUNT']}"
                if "TORCHELASTIC_RESTART_COUNT" in env
                else None
            ),
        )
        config.validate()
        if config.lighthouse_addr:
            check_lighthouse_address(config.lighthouse_addr, lighthouse_from)
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
