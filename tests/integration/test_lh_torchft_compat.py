"""torchft's calling conventions against a real lighthouse on 127.0.0.1: None
arguments, ``http://`` addresses, member ``data`` dicts and ``Quorum.created``."""

from __future__ import annotations

import threading
from concurrent import futures
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest

from lighthouse import (
    FaultToleranceError,
    LighthouseClient,
    LighthouseServer,
    Quorum,
    QuorumMember,
    services,
    validate,
    wire,
)
from lighthouse.coordinator.quorum import DEFAULT_HEARTBEAT_TIMEOUT_MS, DEFAULT_JOIN_TIMEOUT_MS
from tests.integration.lh_fixtures import lighthouse

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=10)


def quorum_together(addr: str, asks: dict[str, dict[str, Any]]) -> dict[str, Quorum]:
    """Each replica id asks ``LighthouseClient(addr).quorum(rid, T, **kw)`` on its own
    thread and client at once; returns every answer (re-raises the first error)."""
    out: dict[str, Quorum] = {}
    errors: list[BaseException] = []

    def one(rid: str, kw: dict[str, Any]) -> None:
        client = LighthouseClient(addr, connect_timeout=timedelta(seconds=5))
        try:
            out[rid] = client.quorum(replica_id=rid, timeout=T, **kw)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=item) for item in asks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if errors:
        raise errors[0]
    assert set(out) == set(asks)
    return out


def test_torchft_constructor_with_none_serves_on_an_http_address() -> None:
    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=None)
    try:
        assert server.config.join_timeout_s == DEFAULT_JOIN_TIMEOUT_MS / 1000
        assert server.config.heartbeat_timeout_s == DEFAULT_HEARTBEAT_TIMEOUT_MS / 1000
        assert server.address() == f"http://127.0.0.1:{server.port}"
        assert server.bare_address() == f"127.0.0.1:{server.port}"
        q = LighthouseClient(addr=server.address(), connect_timeout=timedelta(seconds=1)).quorum(
            replica_id="solo", timeout=T, world_size=1, shrink_only=False
        )
        assert q.replica_ids == ["solo"] and q.participants[0].data is None
    finally:
        server.shutdown()
    server.shutdown()  # idempotent, as torchft's


def test_all_none_timing_arguments_are_accepted() -> None:
    with lighthouse(
        min_replicas=1, join_timeout_ms=None, quorum_tick_ms=None, heartbeat_timeout_ms=None
    ) as lh:
        assert LighthouseClient(lh.address()).quorum("a", T).replica_ids == ["a"]


def test_two_clients_each_see_the_others_data_dict_and_a_recent_utc_created() -> None:
    a_data = {"my_data": 1234, "nested": {"xs": [1, 2.5, None, True], "s": "\u00e9"}}
    b_data = {"other": ["b", {"k": False}]}
    with lighthouse(min_replicas=2) as lh:
        before = datetime.now(timezone.utc)
        got = quorum_together(
            lh.address(),
            {
                "a": {"step": 1, "world_size": 1, "data": a_data},
                "b": {"step": 1, "world_size": 1, "data": b_data},
            },
        )
        after = datetime.now(timezone.utc)
    assert got["a"] == got["b"]
    for q in got.values():
        assert q.replica_ids == ["a", "b"]
        by_id = {m.replica_id: m for m in q.participants}
        assert by_id["a"].data == a_data and isinstance(by_id["a"].data, dict)
        assert by_id["b"].data == b_data and isinstance(by_id["b"].data, dict)
        created = q.created
        assert isinstance(created, datetime)
        assert created.tzinfo is not None and created.utcoffset() == timedelta(0)
        # stamped to the millisecond (floor) by this machine's clock
        assert before - timedelta(milliseconds=1) <= created <= after
        assert created == datetime.fromtimestamp(q.created_unix_ms / 1000, timezone.utc)
        assert created.seconds == q.created_unix_ms // 1000


def test_a_member_without_data_reads_none_beside_one_with_data() -> None:
    with lighthouse(min_replicas=2) as lh:
        got = quorum_together(lh.address(), {"a": {"data": {"k": 1}}, "b": {}})
    data = {m.replica_id: m.data for m in got["b"].participants}
    assert data == {"a": {"k": 1}, "b": None}


def test_a_reply_whose_data_is_not_json_is_a_clear_error() -> None:
    """A (non-conforming) lighthouse that relays bad data text: the client says
    so with the member named, and never evaluates the text."""
    bad = validate.with_data_json(QuorumMember("evil"), "__import__('os')")
    reply = wire.encode_lighthouse_quorum_response(Quorum(1, "e", (bad,), 1))
    handlers = {
        "Quorum": grpc.unary_unary_rpc_method_handler(lambda request, context: reply),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(services.LIGHTHOUSE_SERVICE, handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        client = LighthouseClient(f"http://127.0.0.1:{port}")
        with pytest.raises(FaultToleranceError, match="malformed reply") as info:
            client.quorum("a", T, data={"fine": True})
        assert "QuorumMember 'evil': data must be JSON text" in str(info.value)
        client.close()
    finally:
        server.stop(grace=None)
