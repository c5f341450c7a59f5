"""The lighthouse over real gRPC on 127.0.0.1: quorums, errors, status, restarts, fuzz."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import urllib.request
from datetime import timedelta

import grpc
import pytest

from lighthouse import (
    FakeClock,
    LighthouseClient,
    LighthouseUnavailableError,
    QuorumTimeoutError,
    services,
    validate,
    wire,
)
from lighthouse.types import Quorum, QuorumMember
from tests.integration.lh_fixtures import lighthouse

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=10)


def ask_all(addr: str, ids: list[str], **kw: object) -> dict[str, Quorum]:
    out: dict[str, Quorum] = {}
    errors: list[BaseException] = []

    def one(rid: str) -> None:
        try:
            out[rid] = LighthouseClient(addr).quorum(rid, T, **kw)  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if errors:
        raise errors[0]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_quorum_and_heartbeat_over_grpc() -> None:
    with lighthouse(min_replicas=2) as lh:
        got = ask_all(lh.address(), ["b", "a"], step=3, data={"k": [1]})
        assert got["a"] == got["b"]
        q = got["a"]
        assert q.replica_ids == ["a", "b"] and q.epoch == lh.epoch and q.quorum_id == 1
        assert q.participants[0].data == {"k": [1]}
        assert LighthouseClient(lh.address()).heartbeat("a") == lh.epoch
        again = ask_all(lh.address(), ["a", "b"], step=4)
        assert again["a"].quorum_id == 1  # same membership, same id


def test_bad_input_is_refused_with_a_clear_reason() -> None:
    with lighthouse() as lh:
        client = LighthouseClient(lh.address())
        with pytest.raises(ValueError, match="replica_id must be a non-empty string"):
            client.quorum("", T)
        with pytest.raises(ValueError, match="data must be JSON-serializable"):
            client.quorum("a", T, data={"x": float("nan")})
        with pytest.raises(TypeError, match="data must be JSON-serializable"):
            client.quorum("a", T, data={"x": object()})
        raw = grpc.insecure_channel(lh.bare_address()).unary_unary(
            f"/{services.LIGHTHOUSE_SERVICE}/Quorum"
        )
        cases = [
            (QuorumMember(""), "replica_id must be a non-empty string"),
            (QuorumMember("a", step=-4), "step must be >= 0 and fit in an int64, got -4"),
            (QuorumMember("a", address="h:1", world_size=0), "world_size must be >= 1"),
            (validate.with_data_json(QuorumMember("a"), "[1,"), "data must be JSON text"),
        ]
        for member, msg in cases:
            with pytest.raises(grpc.RpcError) as info:
                raw(wire.encode_lighthouse_quorum_request(member), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert msg in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x00" * (2 * 1024 * 1024), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_unreachable_lighthouse_names_the_address_after_bounded_retries() -> None:
    addr = f"127.0.0.1:{free_port()}"
    client = LighthouseClient(addr, connect_timeout=timedelta(milliseconds=300))
    start = time.monotonic()
    with pytest.raises(LighthouseUnavailableError, match=addr):
        client.quorum("a", timedelta(seconds=20))
    assert time.monotonic() - start < 10  # bounded by connect_timeout, not the deadline


def test_deadline_gives_quorum_timeout_and_the_request_is_withdrawn() -> None:
    with lighthouse(min_replicas=2, join_timeout_ms=0) as lh:
        with pytest.raises(QuorumTimeoutError):
            LighthouseClient(lh.address()).quorum("a", timedelta(milliseconds=200))
        got = ask_all(lh.address(), ["b", "c"])
        assert got["b"].replica_ids == ["b", "c"]  # the cancelled "a" is never a member


def test_status_metrics_and_offline_dashboard() -> None:
    with lighthouse(min_replicas=2, http_bind="127.0.0.1:0") as lh:
        ask_all(lh.address(), ["a", "b"], step=5, step_time_ms=120.0)
        base = lh.http_address()
        assert base is not None
        page = urllib.request.urlopen(base + "/", timeout=5).read().decode()
        assert "<script src" not in page and "https://" not in page and "http://" not in page
        status = json.loads(urllib.request.urlopen(base + "/status", timeout=5).read())
        assert status["epoch"] == lh.epoch and status["quorum_id"] == 1
        members = status["quorum"]["members"]
        assert [m["replica_id"] for m in members] == ["a", "b"]
        assert members[0]["step"] == 5 and members[0]["last_seen_s_ago"] is not None
        assert status["step_report"]["median_step_time_ms"] == 120.0
        assert "reason" in status["next_quorum"]
        metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert "lighthouse_quorums_total 1.0" in metrics
        assert "lighthouse_quorum_members 2.0" in metrics
        assert "lighthouse_quorum_latency_seconds_bucket" in metrics
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base + "/nope", timeout=5)


def test_restart_on_the_same_address_gets_a_new_epoch_and_clients_reconnect() -> None:
    bind = f"127.0.0.1:{free_port()}"
    client = LighthouseClient(bind, connect_timeout=timedelta(seconds=5))
    with lighthouse(bind=bind) as lh1:
        q1 = client.quorum("a", T)
    with lighthouse(bind=bind) as lh2:
        q2 = client.quorum("a", T)
    assert (q1.epoch, q2.epoch) == (lh1.epoch, lh2.epoch)
    assert (q1.epoch, q1.quorum_id) != (q2.epoch, q2.quorum_id)


def test_fuzzed_requests_never_stop_the_server() -> None:
    rng = random.Random(1234)
    clock = FakeClock()
    with lighthouse(min_replicas=1, join_timeout_ms=0, clock=clock) as lh:
        channel = grpc.insecure_channel(lh.bare_address())
        methods = {
            name: channel.unary_unary(f"/{services.LIGHTHOUSE_SERVICE}/{name}")
            for name in ("Quorum", "Heartbeat", "Nope")
        }

        def random_text() -> str:
            alphabet = "ab:- \t\n\x00\u00e9\u4e2d{}[]\"'"
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))

        for i in range(150):
            if i % 2:
                payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
            else:
                member = QuorumMember(
                    random_text(),
                    random_text(),
                    random_text(),
                    rng.randint(-5, 2**40),
                    rng.randint(0, 3),
                    rng.random() < 0.5,
                    None,
                    rng.randint(-2, 2),
                    rng.choice([0.0, 1.5, float("inf"), -1.0]),
                )
                fuzzed = validate.with_data_json(member, random_text())  # raw text on the wire
                payload = wire.encode_lighthouse_quorum_request(fuzzed)
            method = methods[rng.choice(["Quorum", "Quorum", "Heartbeat", "Nope"])]
            try:
                method(payload, timeout=0.05)
            except grpc.RpcError as exc:
                assert exc.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.UNIMPLEMENTED,
                    grpc.StatusCode.ABORTED,
                ), exc
        liveness = channel.stream_stream(f"/{services.LIGHTHOUSE_SERVICE}/Liveness")
        with pytest.raises(grpc.RpcError) as info:
            list(liveness(iter([b"\xff\xff"]), timeout=5))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        clock.advance(60)  # every fuzzed id is now long silent
        q = LighthouseClient(lh.address()).quorum("after-fuzz", T)
        assert q.replica_ids == ["after-fuzz"]


def test_heartbeat_with_an_empty_id_is_refused() -> None:
    with lighthouse() as lh:
        raw = grpc.insecure_channel(lh.bare_address()).unary_unary(
            f"/{services.LIGHTHOUSE_SERVICE}/Heartbeat"
        )
        with pytest.raises(grpc.RpcError) as info:
            raw(wire.encode_heartbeat_request(""), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "replica_id must be a non-empty string" in info.value.details()
