"""Input checks shared by the servers and clients. Each raises ``ValueError`` that
names the field, what was expected and what arrived (house rule 3)."""

from __future__ import annotations

import json
import math
import re

from lighthouse.types import QuorumMember

MAX_ID_CHARS = 256
MAX_ADDRESS_CHARS = 512
MAX_DATA_BYTES = 64 * 1024
MAX_METADATA_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024  # gRPC receive limit on both servers
_WHITESPACE = re.compile(r"\s")  # checked on every quorum request: a scan in C


def check_replica_id(replica_id: str) -> str:
    """Non-empty, at most MAX_ID_CHARS characters, printable, no whitespace."""
    if not replica_id:
        raise ValueError("replica_id must be a non-empty string, got ''")
    if len(replica_id) > MAX_ID_CHARS:
        raise ValueError(
            f"replica_id must be at most {MAX_ID_CHARS} characters, got {len(replica_id)}"
        )
    if not replica_id.isprintable() or _WHITESPACE.search(replica_id):
        raise ValueError(
            f"replica_id must be printable without whitespace, got {replica_id[:64]!r}"
        )
    return replica_id


def check_step(name: str, value: int) -> int:
    """A non-negative counter (step, commit_failures)."""
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_data(data: str) -> str:
    """Empty, or JSON text of at most MAX_DATA_BYTES bytes."""
    if not data:
        return data
    size = len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_DATA_BYTES:
        raise ValueError(f"data must be at most {MAX_DATA_BYTES} bytes of JSON, got {size} bytes")
    try:
        json.loads(data)
    except ValueError as exc:
        raise ValueError(f"data must be JSON text, got {data[:64]!r}: {exc}") from None
    return data


def check_member(m: QuorumMember) -> QuorumMember:
    """Validate a quorum request. ``world_size`` may be 0 only for bare clients
    (no manager ``address``); a replica group always has at least one rank."""
    check_replica_id(m.replica_id)
    for name, value in (("address", m.address), ("store_address", m.store_address)):
        if len(value) > MAX_ADDRESS_CHARS:
            raise ValueError(
                f"{name} must be at most {MAX_ADDRESS_CHARS} characters, got {len(value)}"
            )
    check_step("step", m.step)
    check_step("commit_failures", m.commit_failures)
    if m.address and m.world_size < 1:
        raise ValueError(
            f"world_size must be >= 1 for a replica group (address {m.address!r}), got {m.world_size}"
        )
    if not math.isfinite(m.step_time_ms) or m.step_time_ms < 0:
        raise ValueError(f"step_time_ms must be a finite number >= 0, got {m.step_time_ms}")
    check_data(m.data)
    size = sum(map(len, m.checkpoint_metadata))
    if size > MAX_METADATA_BYTES:
        raise ValueError(
            f"checkpoint_metadata must total at most {MAX_METADATA_BYTES} characters, got {size}"
        )
    return m


def check_group_rank(group_rank: int, world_size: int) -> int:
    """0 <= group_rank < world_size."""
    if not 0 <= group_rank < world_size:
        raise ValueError(f"group_rank must be in [0, {world_size}), got {group_rank}")
    return group_rank
