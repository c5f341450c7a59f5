"""A quorum stream that breaks under a request is asked again, whatever code gRPC gives.

gRPC's Python client reports an operation on a stream whose connection has
died as INTERNAL ("Internal error from Core"), not UNAVAILABLE: in a 100-kill
soak a lighthouse restarted under two replicas' quorum streams, and their
links raised it as a failed step instead of asking the restarted lighthouse.
Here a scripted lighthouse (real gRPC, raw bytes) breaks the first quorum
stream with each such code and answers on the next one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from lighthouse import services, wire
from lighthouse._calls import error_for_status
from lighthouse.errors import FaultToleranceError
from lighthouse.replica.link import LighthouseLink
from lighthouse.types import Quorum, QuorumMember

pytestmark = pytest.mark.timeout(60)
EPOCH = "scripted"


class ScriptedLighthouse:
    """Opens liveness streams; breaks the first `breaks` quorum streams with
    `code`, then answers each request with quorum 7 of the asker alone."""

    def __init__(self, code: grpc.StatusCode, breaks: int = 1) -> None:
        self._code = code
        self._breaks = breaks
        self._lock = threading.Lock()
        self.quorum_streams = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {
            services.LIGHTHOUSE_LIVENESS.name: grpc.stream_stream_rpc_method_handler(
                self._liveness
            ),
            services.LIGHTHOUSE_QUORUM_STREAM.name: grpc.stream_stream_rpc_method_handler(
                self._quorum_stream
            ),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(services.LIGHTHOUSE_SERVICE, handlers),)
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def _liveness(self, pings: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        next(pings)
        yield wire.encode_liveness_ack(EPOCH, 0)
        for _ in pings:  # the link pings until it closes the stream
            pass

    def _quorum_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        with self._lock:
            self.quorum_streams += 1
            broken = self.quorum_streams <= self._breaks
        for request in requests:
            if broken:
                context.abort(self._code, "scripted: the stream broke")
            member = wire.decode_lighthouse_quorum_request(request)
            yield wire.encode_lighthouse_quorum_response(Quorum(7, EPOCH, (member,)))

    def stop(self) -> None:
        self._server.stop(grace=None)


async def _ask_once(port: int, connect_s: float = 5.0) -> tuple[Quorum, int]:
    link = LighthouseLink(
        "rep0",
        f"127.0.0.1:{port}",
        heartbeat_s=0.1,
        connect_s=connect_s,
        retries=0,  # no retries for other failures: only a broken call is asked again
        on_notice=lambda notice: None,
    )
    await link.connect()
    try:
        loop = asyncio.get_running_loop()
        return await link.quorum(QuorumMember("rep0", step=3), loop.time() + 20.0)
    finally:
        await link.close(leave=False)


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED],
    ids=lambda c: c.name,
)
def test_a_quorum_stream_broken_under_the_request_is_asked_again(
    code: grpc.StatusCode,
) -> None:
    lighthouse = ScriptedLighthouse(code)
    try:
        quorum, lease_id = asyncio.run(_ask_once(lighthouse.port))
    finally:
        lighthouse.stop()
    assert (quorum.quorum_id, lease_id) == (7, 0)
    assert [m.replica_id for m in quorum.participants] == ["rep0"]
    assert lighthouse.quorum_streams == 2  # the broken stream, then a fresh one


def test_a_refusal_is_not_asked_again() -> None:
    # A code a server answers with (not a broken call) fails the request at once.
    lighthouse = ScriptedLighthouse(grpc.StatusCode.PERMISSION_DENIED)
    try:
        with pytest.raises(FaultToleranceError, match="PERMISSION_DENIED"):
            asyncio.run(_ask_once(lighthouse.port))
    finally:
        lighthouse.stop()
    assert lighthouse.quorum_streams == 1


def test_a_stream_that_keeps_breaking_fails_after_the_connect_timeout() -> None:
    lighthouse = ScriptedLighthouse(grpc.StatusCode.INTERNAL, breaks=10_000)
    try:
        with pytest.raises(FaultToleranceError, match="unreachable for"):
            asyncio.run(_ask_once(lighthouse.port, connect_s=0.5))
    finally:
        lighthouse.stop()
    assert lighthouse.quorum_streams > 1


def test_unary_calls_retry_a_broken_call_and_fail_an_answer() -> None:
    def outcome(code: grpc.StatusCode) -> FaultToleranceError | None:
        return error_for_status(code, "d", what="quorum", addr="a:1", timeout_s=1.0)

    for broken in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
        assert outcome(broken) is None  # retried while the connect timeout lasts
    assert isinstance(outcome(grpc.StatusCode.UNKNOWN), FaultToleranceError)
