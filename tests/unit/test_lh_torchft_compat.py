"""torchft's Python shapes without sockets: member ``data`` as a decoded value
(JSON text on the wire only), ``Quorum.created``, and ``LighthouseServer``'s
torchft-style arguments (None = our default; checked before anything binds)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from lighthouse import LighthouseServer, Timestamp, validate, wire
from lighthouse.coordinator.quorum import (
    DEFAULT_HEARTBEAT_TIMEOUT_MS,
    DEFAULT_JOIN_TIMEOUT_MS,
    DEFAULT_QUORUM_TICK_MS,
)
from lighthouse.coordinator.server import _ms_arg
from lighthouse.types import Quorum, QuorumMember


def _through_the_wire(m: QuorumMember) -> QuorumMember:
    """What a lighthouse decodes from ``m``, and what its clients decode when relayed."""
    at_server = wire.decode_lighthouse_quorum_request(wire.encode_lighthouse_quorum_request(m))
    reply = wire.encode_lighthouse_quorum_response(Quorum(1, "e", (at_server,), 5))
    return wire.decode_lighthouse_quorum_response(reply).participants[0]


@pytest.mark.parametrize(
    "value",
    [
        {"key1": "value1", "key2": 42, "nested": {"a": [1, 2.5, None, True]}},
        [1, "two", {"three": 3}],
        "{not parsed: a str is a JSON string}",
        "",
        0,
        False,
        {"unicode": "\u00e9\u4e2d\U0001f600"},
    ],
)
def test_data_comes_back_as_the_value_that_was_sent(value: Any) -> None:
    got = _through_the_wire(QuorumMember("a", data=value))
    assert got.data == value and type(got.data) is type(value)


def test_no_data_is_none_and_travels_as_empty_text() -> None:
    assert validate.encode_data(None) == ""
    assert validate.decode_data("") is None
    assert _through_the_wire(QuorumMember("a")).data is None


def test_json_normalises_tuples_and_keys_like_torchft() -> None:
    assert _through_the_wire(QuorumMember("a", data={1: (2, 3)})).data == {"1": [2, 3]}


def test_a_relayed_member_keeps_the_exact_text_it_arrived_with() -> None:
    text = '{ "b" : 1,  "a" : [ 1.0 ] }'  # not how json.dumps would write it
    raw = validate.with_data_json(QuorumMember("a", data={"b": 1, "a": [1.0]}), text)
    decoded = wire.decode_lighthouse_quorum_request(wire.encode_lighthouse_quorum_request(raw))
    assert decoded.data == {"b": 1, "a": [1.0]}
    assert validate.member_data_json(decoded) == text
    moved = dataclasses.replace(decoded, step=3)  # a changed copy forgets it and re-encodes
    assert validate.member_data_json(moved) == '{"b":1,"a":[1.0]}'


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{oops", "Expecting property name"),
        ("[1,", "Expecting value"),
        ('{"x": NaN}', "NaN is not JSON"),
        ("Infinity", "Infinity is not JSON"),
        ("[1] trailing", "Extra data"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_text_that_is_not_json_is_refused_by_name_never_evaluated(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="data must be JSON text") as info:
        validate.decode_data(text)
    assert why in str(info.value)
    bad = wire.encode_lighthouse_quorum_request(validate.with_data_json(QuorumMember("r7"), text))
    with pytest.raises(ValueError, match=r"QuorumMember 'r7': data must be JSON text"):
        wire.decode_lighthouse_quorum_request(bad)
    reply = wire.encode_lighthouse_quorum_response(
        Quorum(1, "e", (validate.with_data_json(QuorumMember("r7"), text),))
    )
    with pytest.raises(ValueError, match=r"QuorumMember 'r7': data must be JSON text"):
        wire.decode_lighthouse_quorum_response(reply)


def test_values_json_cannot_hold_are_refused_before_sending() -> None:
    with pytest.raises(TypeError, match=r"data must be JSON-serializable .* got set"):
        validate.encode_data({1, 2})
    with pytest.raises(TypeError, match="got datetime"):
        validate.check_member(QuorumMember("a", data=datetime.now(timezone.utc)))
    with pytest.raises(ValueError, match="data must be JSON-serializable"):
        validate.encode_data([float("inf")])
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="data must be JSON-serializable"):
        validate.encode_data(loop)
    with pytest.raises(ValueError, match="data must be at most 65536 bytes of JSON"):
        validate.encode_data({"k": "x" * validate.MAX_DATA_BYTES})


def test_members_with_dict_data_hash_and_compare() -> None:
    a = QuorumMember("a", data={"k": [1]})
    assert a == QuorumMember("a", data={"k": [1]}) and a != QuorumMember("a", data={"k": [2]})
    assert hash(a) == hash(QuorumMember("a", data={"k": [2]}))  # data is left out of hash()
    assert len({a, QuorumMember("b")}) == 2
    assert Quorum(1, "e", (a,)) == Quorum(1, "e", (QuorumMember("a", data={"k": [1]}),))
    assert "_data_json" not in dataclasses.asdict(_through_the_wire(a))


def test_created_is_an_aware_utc_datetime_with_torchfts_seconds_and_nanos() -> None:
    q = Quorum(1, "e", (), created_unix_ms=1_700_000_000_123)
    assert isinstance(q.created, datetime) and isinstance(q.created, Timestamp)
    assert q.created == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=timezone.utc)
    assert q.created.utcoffset() == timedelta(0)
    assert (q.created.seconds, q.created.nanos) == (1_700_000_000, 123_000_000)
    assert q.created_unix_ms == 1_700_000_000_123  # kept
    before = Quorum(1, "e", (), created_unix_ms=-1).created  # floor, as protobuf's Timestamp
    assert (before.seconds, before.nanos) == (-1, 999_000_000)
    assert Quorum(1, "e", ()).created == datetime(1970, 1, 1, tzinfo=timezone.utc)  # 0 = unknown
    with pytest.raises(ValueError, match=r"unix_ms must fall in years 1\.\.9999"):
        Timestamp.from_unix_ms(2**62)


def test_created_survives_the_wire() -> None:
    q = Quorum(3, "e", (QuorumMember("a"),), created_unix_ms=1_234_567)
    got = wire.decode_lighthouse_quorum_response(wire.encode_lighthouse_quorum_response(q))
    assert got.created == q.created and got.created.tzinfo is not None


def test_millisecond_arguments_take_none_as_our_default() -> None:
    assert _ms_arg("join_timeout_ms", None, DEFAULT_JOIN_TIMEOUT_MS, 0) == DEFAULT_JOIN_TIMEOUT_MS
    assert _ms_arg("quorum_tick_ms", None, DEFAULT_QUORUM_TICK_MS, 1) == DEFAULT_QUORUM_TICK_MS
    assert _ms_arg("x", None, DEFAULT_HEARTBEAT_TIMEOUT_MS, 1) == DEFAULT_HEARTBEAT_TIMEOUT_MS
    assert _ms_arg("join_timeout_ms", 0, 7, 0) == 0
    assert _ms_arg("quorum_tick_ms", 2**31 - 1, 7, 1) == 2**31 - 1


@pytest.mark.parametrize(
    ("kwargs", "error", "msg"),
    [
        ({"join_timeout_ms": "100"}, TypeError, "join_timeout_ms must be an int .* got '100'"),
        ({"quorum_tick_ms": 100.0}, TypeError, "quorum_tick_ms must be an int .* got 100.0"),
        ({"heartbeat_timeout_ms": True}, TypeError, "heartbeat_timeout_ms must be an int .* True"),
        ({"join_timeout_ms": -1}, ValueError, r"join_timeout_ms must be in \[0, 2147483647\].* -1"),
        ({"quorum_tick_ms": 0}, ValueError, r"quorum_tick_ms must be in \[1, 2147483647\].* 0"),
        ({"heartbeat_timeout_ms": 2**31}, ValueError, "heartbeat_timeout_ms .* got 2147483648"),
        ({"min_replicas": None}, TypeError, "min_replicas must be an int, got None"),
        ({"min_replicas": 1.5}, TypeError, "min_replicas must be an int, got 1.5"),
        ({"min_replicas": 0}, ValueError, "min_replicas must be >= 1, got 0"),
        ({"bind": 5}, TypeError, "bind must be a 'host:port' string or None, got 5"),
    ],
)
def test_bad_server_arguments_name_the_value_before_anything_binds(
    kwargs: dict[str, Any], error: type[Exception], msg: str
) -> None:
    args: dict[str, Any] = {"bind": "127.0.0.1:0", "min_replicas": 1, **kwargs}
    with pytest.raises(error, match=msg):
        LighthouseServer(**args)


def test_nesting_has_one_fixed_bound_on_both_sides_whatever_the_stack_depth() -> None:
    """101 levels fail alike when encoding and decoding; brackets inside strings
    (escaped quotes included) do not count."""
    ok = json.loads("[" * validate.MAX_DATA_DEPTH + "]" * validate.MAX_DATA_DEPTH)
    assert validate.decode_data(validate.encode_data(ok)) == ok
    deep = json.loads("[" * 101 + "]" * 101)
    with pytest.raises(ValueError, match=r"nested at most 100 .* got 101 levels"):
        validate.encode_data(deep)
    with pytest.raises(ValueError, match=r"nested at most 100 .* got 101 levels"):
        validate.decode_data("[" * 101 + "]" * 101)
    tricky = {"s": '\\"' + "[" * 500, "t": "{" * 500}
    assert validate.decode_data(validate.encode_data(tricky)) == tricky


def test_every_flag_takes_torchfts_underscore_spelling_too() -> None:
    from lighthouse.coordinator.cli import build_parser

    flags = "--min-replicas 2 --join-timeout-ms 10000 --quorum-tick-ms 50"
    flags += " --heartbeat-timeout-ms 700 --http-bind none --state-file none"
    hyphens = build_parser().parse_args(flags.split())
    underscores = build_parser().parse_args(flags.replace("-", "_").replace("__", "--").split())
    assert vars(hyphens) == vars(underscores)
    assert (underscores.min_replicas, underscores.join_timeout_ms) == (2, 10000)


def test_torchft_lighthouse_has_torchfts_defaults_and_requires_min_replicas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lighthouse.coordinator.cli import (
        TORCHFT_JOIN_TIMEOUT_MS,
        build_parser,
        default_binds,
        torchft_main,
    )

    parser = build_parser("torchft_lighthouse", None, TORCHFT_JOIN_TIMEOUT_MS)
    args = parser.parse_args(["--min_replicas", "1"])
    assert (args.join_timeout_ms, args.quorum_tick_ms) == (60_000, 100)
    # torchft's [::]:29510 with a job secret; this machine only without one
    assert default_binds(args.bind, args.http_bind, None, False) == (
        "127.0.0.1:29510",
        "127.0.0.1:29511",
    )
    assert default_binds(args.bind, args.http_bind, "s" * 16, False) == (
        "[::]:29510",
        "[::]:29511",
    )
    assert args.heartbeat_timeout_ms == DEFAULT_HEARTBEAT_TIMEOUT_MS
    with pytest.raises(SystemExit) as exc:
        torchft_main([])
    assert exc.value.code == 2
    assert "--min-replicas/--min_replicas" in capsys.readouterr().err
