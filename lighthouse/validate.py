"""Input checks shared by the servers and clients. Each raises ``ValueError``
(``TypeError`` for a value of the wrong type) that names the field, what was
expected and what arrived."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta
from typing import Any

from lighthouse.types import (
    CollectivesDone,
    HealReport,
    IntegrityKind,
    IntegrityReport,
    LivenessPing,
    ManagerQuorumRequest,
    QuorumMember,
)

MAX_ID_CHARS = 256
MAX_ADDRESS_CHARS = 512
MAX_DATA_BYTES = 64 * 1024
MAX_METADATA_BYTES = 64 * 1024
MAX_UNREACHABLE = 1024  # replica ids one member may report unreachable
MAX_MESSAGE_BYTES = 1024 * 1024  # gRPC receive limit on both servers
MAX_INTEGRITY_TENSORS = 8  # tensor names one integrity report may carry
MAX_TENSOR_NAME_CHARS = 256  # characters of one of those names
# Deepest nesting of arrays/objects in a member's data: a fixed bound, so that
# whether a value passes never depends on how deep the caller's stack happens to be
# (the JSON parser recurses once per level).
MAX_DATA_DEPTH = 100
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
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


MAX_COUNTER = 2**63 - 1  # the wire's int64


def check_step(name: str, value: int) -> int:
    """A non-negative counter (step, commit_failures) that fits the wire's int64."""
    if not 0 <= value <= MAX_COUNTER:
        raise ValueError(f"{name} must be >= 0 and fit in an int64, got {value}")
    return value


def timeout_seconds(name: str, value: timedelta) -> float:
    """A positive ``timedelta`` argument, in seconds. ``TypeError`` for any other
    type, ``ValueError`` for zero or less."""
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {type(value).__name__}")
    s = value.total_seconds()
    if s <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return s


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return check_step(name, value)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_heal_report(h: HealReport) -> HealReport:
    """A heal report's types and ranges: ``step`` and ``bytes_received`` ints in
    [0, 2**63) (the wire's int64), ``transfer_s`` a finite float >= 0 (seconds).
    ``TypeError`` for a wrong type, ``ValueError`` for a value out of range, each
    naming the field and the value."""
    if not isinstance(h, HealReport):
        raise TypeError(f"heal must be a HealReport or None, got {h!r:.100}")
    _check_int("heal.step", h.step)
    _check_int("heal.bytes_received", h.bytes_received)
    s = h.transfer_s
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise TypeError(f"heal.transfer_s must be a float number of seconds, got {s!r}")
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"heal.transfer_s must be a finite number >= 0, got {s}")
    return h


def check_integrity_report(r: IntegrityReport) -> IntegrityReport:
    """An integrity report's types and bounds: ``step`` an int in [0, 2**63) (the
    wire's int64), ``kind`` an ``IntegrityKind``, ``tensors`` a tuple of at most
    ``MAX_INTEGRITY_TENSORS`` printable names of 1 to ``MAX_TENSOR_NAME_CHARS``
    characters. ``TypeError`` for a wrong type, ``ValueError`` for a value out of
    range, each naming the field and the value."""
    if not isinstance(r, IntegrityReport):
        raise TypeError(f"integrity must be an IntegrityReport or None, got {r!r:.100}")
    _check_int("integrity.step", r.step)
    if not isinstance(r.kind, IntegrityKind):
        raise TypeError(f"integrity.kind must be an IntegrityKind, got {r.kind!r:.100}")
    if not isinstance(r.tensors, tuple):
        raise TypeError(f"integrity.tensors must be a tuple of str, got {r.tensors!r:.100}")
    if len(r.tensors) > MAX_INTEGRITY_TENSORS:
        raise ValueError(
            f"integrity.tensors must name at most {MAX_INTEGRITY_TENSORS} tensors, "
            f"got {len(r.tensors)}"
        )
    for name in r.tensors:
        if not isinstance(name, str):
            raise TypeError(f"integrity.tensors must hold str names, got {name!r:.100}")
        if not 0 < len(name) <= MAX_TENSOR_NAME_CHARS or not name.isprintable():
            raise ValueError(
                f"integrity.tensors names must be printable, 1 to {MAX_TENSOR_NAME_CHARS} "
                f"characters, got {name[:64]!r} ({len(name)} characters)"
            )
    return r


def check_manager_quorum_request(req: ManagerQuorumRequest) -> ManagerQuorumRequest:
    """Types and ranges of one rank's quorum request, checked before it is sent and
    after it is decoded: ``TypeError`` for a wrong type, ``ValueError`` for a value
    out of range, each naming the field and the value. The group rank's upper
    bound (the group's world size) and the metadata's size are the manager
    server's to check."""
    _check_int("group_rank", req.group_rank)
    _check_int("step", req.step)
    _check_int("commit_failures", req.commit_failures)
    if not isinstance(req.checkpoint_metadata, str):
        raise TypeError(f"checkpoint_metadata must be a str, got {req.checkpoint_metadata!r}")
    _check_bool("shrink_only", req.shrink_only)
    _check_bool("init_sync", req.init_sync)
    timeout_seconds("timeout", req.timeout)
    ms = req.step_time_ms
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise TypeError(f"step_time_ms must be a float number of milliseconds, got {ms!r}")
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"step_time_ms must be a finite number >= 0, got {ms}")
    busy = req.busy_ms
    if isinstance(busy, bool) or not isinstance(busy, (int, float)):
        raise TypeError(f"busy_ms must be a float number of milliseconds, got {busy!r}")
    check_busy_ms(busy, ms)
    if req.heal is not None:
        check_heal_report(req.heal)
    if req.integrity is not None:
        check_integrity_report(req.integrity)
    if req.collectives_done is not None:
        check_collectives_done(req.collectives_done)
    return req


def check_collectives_done(done: CollectivesDone) -> CollectivesDone:
    """``TypeError`` or ``ValueError`` naming the field and the value."""
    if not isinstance(done, CollectivesDone):
        raise TypeError(f"collectives_done must be a CollectivesDone, got {done!r}")
    if not isinstance(done.epoch, str) or len(done.epoch) > MAX_ID_CHARS:
        raise ValueError(
            f"collectives_done.epoch must be a str of at most {MAX_ID_CHARS} characters, "
            f"got {done.epoch!r:.80}"
        )
    _check_int("collectives_done.quorum_id", done.quorum_id)
    _check_int("collectives_done.step", done.step)
    return done


def check_busy_ms(busy_ms: float, step_time_ms: float) -> float:
    """A step's own work in milliseconds: finite, >= 0 and at most the step's
    duration ``step_time_ms`` it is part of (so 0 when that is unknown);
    ``ValueError`` naming both otherwise."""
    if not math.isfinite(busy_ms) or busy_ms < 0:
        raise ValueError(f"busy_ms must be a finite number >= 0, got {busy_ms}")
    if busy_ms > step_time_ms:
        raise ValueError(
            f"busy_ms must be at most the step time it is part of, got busy_ms {busy_ms} "
            f"with step_time_ms {step_time_ms}"
        )
    return busy_ms


def check_liveness_ping(ping: LivenessPing) -> LivenessPing:
    """A liveness ping as the lighthouse reads it: its step times finite, >= 0,
    the busy time within the step time, its heal report in range; ``ValueError``
    naming the field otherwise. The replica id is the stream's to check."""
    if not math.isfinite(ping.step_time_ms) or ping.step_time_ms < 0:
        raise ValueError(f"step_time_ms must be a finite number >= 0, got {ping.step_time_ms}")
    check_busy_ms(ping.busy_ms, ping.step_time_ms)
    if ping.floor_wanted < 0:
        raise ValueError(f"floor_wanted must be a step >= 0, got {ping.floor_wanted}")
    if ping.heal is not None:
        check_heal_report(ping.heal)
    return ping


# Where a member keeps the wire text its ``data`` was decoded from (beside its
# dataclass fields, not one of them: ==, repr and asdict ignore it).
DATA_JSON_KEY = "_data_json"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (only finite numbers are)")


def _check_data_size(text: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_DATA_BYTES:
        raise ValueError(f"data must be at most {MAX_DATA_BYTES} bytes of JSON, got {size} bytes")
    _check_data_depth(text)


def _check_data_depth(text: str) -> None:
    """At most MAX_DATA_DEPTH nested arrays/objects. O(1) for text with fewer
    brackets than that (the usual flat dict), else one scan with strings removed."""
    if text.count("[") + text.count("{") <= MAX_DATA_DEPTH:
        return
    depth = deepest = 0
    for ch in _JSON_STRING.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    if deepest > MAX_DATA_DEPTH:
        raise ValueError(
            f"data must be JSON text nested at most {MAX_DATA_DEPTH} arrays/objects deep, "
            f"got {deepest} levels: nested too deeply"
        )


def encode_data(value: Any) -> str:
    """A member's ``data`` value -> its wire text: "" for None, else strict JSON
    (finite numbers only) of at most MAX_DATA_BYTES bytes.

    A ``str`` is a JSON string like any other value (it is not parsed), so the
    receiver gets back exactly the value sent. Raises ``TypeError`` for values
    JSON cannot hold and ``ValueError`` for NaN/infinity, cycles or oversize.
    """
    if value is None:
        return ""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(
            "data must be JSON-serializable (dict, list, str, int, float, bool, None), "
            f"got {type(value).__name__}: {exc}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(
            f"data must be JSON-serializable, got {type(value).__name__}: {exc}"
        ) from None
    _check_data_size(text)
    return text


def decode_data(text: str) -> Any:
    """Wire text -> a member's ``data`` value: None for "", else the parsed JSON.

    Only ``json.loads`` ever reads it (never eval or pickle); text that is not
    strict JSON (NaN, trailing garbage, nesting past the recursion limit)
    raises ``ValueError``.
    """
    if not text:
        return None
    _check_data_depth(text)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError(f"data must be JSON text, got {text[:64]!r}: nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"data must be JSON text, got {text[:64]!r}: {exc}") from None


def member_data_json(m: QuorumMember) -> str:
    """``m.data``'s wire text: the text it was decoded from, else freshly encoded."""
    cached: str | None = m.__dict__.get(DATA_JSON_KEY)
    return encode_data(m.data) if cached is None else cached


def with_data_json(m: QuorumMember, text: str) -> QuorumMember:
    """Remember ``text`` as ``m.data``'s wire text (it must encode ``m.data``), so
    a member relayed unchanged is not re-encoded. ``dataclasses.replace`` drops it."""
    m.__dict__[DATA_JSON_KEY] = text
    return m


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
    check_busy_ms(m.busy_ms, m.step_time_ms)
    _check_data_size(member_data_json(m))
    size = sum(map(len, m.checkpoint_metadata))
    if size > MAX_METADATA_BYTES:
        raise ValueError(
            f"checkpoint_metadata must total at most {MAX_METADATA_BYTES} characters, got {size}"
        )
    if len(m.unreachable) > MAX_UNREACHABLE:
        raise ValueError(
            f"unreachable must name at most {MAX_UNREACHABLE} replicas, got {len(m.unreachable)}"
        )
    for rid in m.unreachable:
        check_replica_id(rid)
    if m.heal is not None:
        check_heal_report(m.heal)
    if m.integrity is not None:
        check_integrity_report(m.integrity)
    return m


def check_group_rank(group_rank: int, world_size: int) -> int:
    """0 <= group_rank < world_size."""
    if not 0 <= group_rank < world_size:
        raise ValueError(f"group_rank must be in [0, {world_size}), got {group_rank}")
    return group_rank
