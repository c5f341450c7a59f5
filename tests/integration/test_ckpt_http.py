"""HTTPTransport between two transports on 127.0.0.1 (server and receiver threads)."""

from __future__ import annotations

import http.client
import io
import logging
import socket
import threading
import time
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

import torchft_pg.checkpointing.http_fetch as http_fetch
from torchft_pg.checkpointing import CheckpointHTTPError, CheckpointTimeoutError, HTTPTransport
from torchft_pg.checkpointing.http_server import SERVED_STEP_HEADER
from torchft_pg.checkpointing.http_transport import MAX_CHUNKS, default_advertise_host
from torchft_pg.checkpointing.skeleton import FORMAT, decode_skeleton
from torchft_pg.checkpointing.transport import Deadline
from torchft_pg.errors import RecoveryError

T = timedelta(seconds=10)
SHORT = timedelta(seconds=0.5)


def state_dict() -> dict[str, Any]:
    w = torch.randn(300, 200)
    return {
        "model": {
            "w": w,
            "w_t": w.t(),
            "big": torch.randn(3 << 20),
            "bf": torch.randn(7).bfloat16(),
        },
        "optim": {
            "state": {0: {"step": torch.tensor(4)}},
            "param_groups": [{"lr": 0.5, "betas": (0.9, 0.99)}],
        },
        "flags": torch.tensor([True, False, True]),
        "epoch": 3,
    }


def check_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["optim"]["param_groups"] == b["optim"]["param_groups"]
    assert torch.equal(a["optim"]["state"][0]["step"], b["optim"]["state"][0]["step"])
    assert torch.equal(a["flags"], b["flags"]) and a["epoch"] == b["epoch"]


@pytest.fixture
def sender() -> Iterator[HTTPTransport[dict[str, Any]]]:
    t: HTTPTransport[dict[str, Any]] = HTTPTransport(T, bind_host="127.0.0.1")
    try:
        yield t
    finally:
        t.shutdown()


def receiver(num_chunks: int = 0, **kw: Any) -> HTTPTransport[dict[str, Any]]:
    return HTTPTransport(T, num_chunks=num_chunks, bind_host="127.0.0.1", **kw)


@pytest.mark.parametrize("num_chunks", [0, 3])
def test_roundtrip_logs_bytes_seconds_and_rate(
    sender: HTTPTransport[dict[str, Any]], num_chunks: int, caplog: pytest.LogCaptureFixture
) -> None:
    sd = state_dict()
    sender.send_checkpoint([1], 5, sd, T)
    r = receiver(num_chunks)
    try:
        with caplog.at_level(logging.INFO, logger="torchft_pg.checkpointing"):
            out = r.recv_checkpoint(0, sender.metadata(), 5, T)
    finally:
        r.shutdown()
    check_same(sd, out)
    assert out["model"]["w_t"].data_ptr() == out["model"]["w"].data_ptr(), "views stay views"
    line = next(m for m in caplog.messages if "received" in m)
    assert "step=5" in line and "bytes=" in line and "GB/s=" in line and "checksum=ok" in line


def test_wrong_step_is_400_naming_both_steps(sender: HTTPTransport[dict[str, Any]]) -> None:
    sender.send_checkpoint([1], 5, state_dict(), T)
    for path in ("/checkpoint/6/meta", "/checkpoint/6/chunk/0/1?serial=x"):
        conn = http.client.HTTPConnection("127.0.0.1", sender.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == 400, path
            assert resp.getheader(SERVED_STEP_HEADER) == "5"
            assert resp.read() == b"requested step 6, but this replica serves step 5"
        finally:
            conn.close()


@pytest.mark.parametrize("num_chunks", [0, 2])
def test_wrong_step_is_a_recovery_error_naming_peer_and_both_steps(
    sender: HTTPTransport[dict[str, Any]], num_chunks: int
) -> None:
    sender.send_checkpoint([1], 5, state_dict(), T)
    r = receiver(num_chunks)
    try:
        with pytest.raises(RecoveryError) as info:
            r.recv_checkpoint(3, sender.metadata(), 6, T)
    finally:
        r.shutdown()
    assert str(info.value).startswith(
        f"HTTP Error 400: rank 3 at {sender.metadata()} serves step 5, not the requested step 6"
    )


def test_wrong_step_is_also_an_urllib_http_error(sender: HTTPTransport[dict[str, Any]]) -> None:
    """Code written for torchft catches `urllib.error.HTTPError` and matches its text."""
    sender.send_checkpoint([1], 2345, state_dict(), T)
    r = receiver()
    try:
        with pytest.raises(
            urllib.error.HTTPError, match=r"Error 400.*serving 2345 but got step=1234"
        ) as info:
            r.recv_checkpoint(0, sender.metadata(), 1234, T)
    finally:
        r.shutdown()
    err = info.value
    assert isinstance(err, RecoveryError) and isinstance(err, CheckpointHTTPError)
    assert err.code == 400 and "/checkpoint/1234/meta?" in err.url
    assert err.headers[SERVED_STEP_HEADER] == "2345"


def test_any_other_refusal_is_an_http_error_with_its_status(
    sender: HTTPTransport[dict[str, Any]],
) -> None:
    sender.send_checkpoint([1], 5, state_dict(), T)
    fetch = http_fetch.ChunkFetcher(
        "127.0.0.1", sender.port, "/checkpoint/", 5, Deadline(T), "rank 0"
    )
    with pytest.raises(CheckpointHTTPError, match="HTTP Error 409: rank 0 refused") as info:
        fetch._open("chunk/0/1?serial=stale")
    assert info.value.code == 409 and "changed since its metadata was read" in str(info.value)


@pytest.mark.parametrize("zero", [timedelta(0), 0, 0.0])
def test_a_zero_timeout_times_out_at_once(
    sender: HTTPTransport[dict[str, Any]], zero: timedelta | float
) -> None:
    """torchft's receive with a zero timeout fails at once with a urllib error."""
    sd = state_dict()
    sender.send_checkpoint([1], 5, sd, T)
    r = receiver()
    try:
        with pytest.raises(urllib.error.URLError, match="urlopen error") as info:
            r.recv_checkpoint(0, sender.metadata(), 5, zero)  # type: ignore[arg-type]
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, RecoveryError)
        assert "timed out" in str(info.value) and "step 5" in str(info.value)
        check_same(sd, r.recv_checkpoint(0, sender.metadata(), 5, T))
        with pytest.raises(ValueError, match="timeout must be positive or zero, got -1 day"):
            r.recv_checkpoint(0, sender.metadata(), 5, timedelta(seconds=-1))
    finally:
        r.shutdown()


@pytest.mark.parametrize("num_chunks", [0, 2])
def test_a_disallowed_checkpoint_ends_in_a_timeout_error_at_the_receivers_timeout(
    num_chunks: int,
) -> None:
    """The source answers "not served within my wait" (503) after its own, shorter,
    wait; the receiver asks again until its own timeout is spent, then raises a
    TimeoutError that says so."""
    sender: HTTPTransport[dict[str, Any]] = HTTPTransport(0.1, bind_host="127.0.0.1")
    r = receiver(num_chunks)
    try:
        sender.send_checkpoint([1], 5, state_dict(), T)
        sender.disallow_checkpoint()
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="timed out") as info:
            r.recv_checkpoint(0, sender.metadata(), 5, SHORT)
        elapsed = time.monotonic() - start
    finally:
        r.shutdown()
        sender.shutdown()
    assert elapsed >= SHORT.total_seconds(), "not before the receiver's own timeout"
    assert isinstance(info.value, RecoveryError) and isinstance(info.value, CheckpointTimeoutError)
    assert "503" in str(info.value) and "step 5" in str(info.value)


def test_address_is_the_url_metadata_advertises(sender: HTTPTransport[dict[str, Any]]) -> None:
    assert sender.address() == sender.metadata() == f"http://127.0.0.1:{sender.port}/checkpoint/"
    sd = state_dict()
    sender.send_checkpoint([1], 2, sd, T)
    r = receiver()
    try:
        check_same(sd, r.recv_checkpoint(0, sender.address(), 2, T))
    finally:
        r.shutdown()


def _served_serial(t: HTTPTransport[dict[str, Any]], step: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", t.port, timeout=10)
    try:
        conn.request("GET", f"/checkpoint/{step}/meta")
        resp = conn.getresponse()
        assert resp.status == 200
        return decode_skeleton(resp.read()).serial
    finally:
        conn.close()


def test_allow_checkpoint_reopens_the_last_sent_state_dict(
    sender: HTTPTransport[dict[str, Any]],
) -> None:
    sd = state_dict()
    sender.send_checkpoint([1], 5, sd, T)
    serial = _served_serial(sender, 5)
    sender.allow_checkpoint(5)
    assert _served_serial(sender, 5) == serial, "still served: allow_checkpoint changes nothing"
    sender.disallow_checkpoint()
    r = receiver(num_chunks=2)
    try:
        with pytest.raises(CheckpointTimeoutError, match=r"timed out.*503"):
            r.recv_checkpoint(0, sender.metadata(), 5, timedelta(seconds=0.2))
        sd["model"]["bf"].add_(1)  # mutated after disallow: re-allowing serves values as now
        sender.allow_checkpoint(5)
        assert sender._gate.serving_step == 5
        check_same(sd, r.recv_checkpoint(0, sender.metadata(), 5, T))
    finally:
        r.shutdown()


def test_allow_checkpoint_for_an_unsent_step_is_a_value_error(
    sender: HTTPTransport[dict[str, Any]],
) -> None:
    with pytest.raises(
        ValueError, match=r"step=3\): nothing was sent for step 3 \(send_checkpoint"
    ):
        sender.allow_checkpoint(3)
    sender.send_checkpoint([1], 5, state_dict(), T)
    sender.disallow_checkpoint()
    with pytest.raises(ValueError, match=r"nothing was sent for step 6 \(the last .* step 5\)"):
        sender.allow_checkpoint(6)
    with pytest.raises(TypeError, match="step must be an int, got str '5'"):
        sender.allow_checkpoint("5")  # type: ignore[arg-type]
    assert sender._gate.serving_step is None, "a refused allow_checkpoint opens nothing"


def test_constructor_takes_torchfts_forms() -> None:
    made = [
        HTTPTransport[dict[str, Any]](T, 2),  # torchft: HTTPTransport(timeout, num_chunks)
        HTTPTransport[dict[str, Any]](timeout=T, num_chunks=0, bind_host="127.0.0.1"),
        HTTPTransport[dict[str, Any]](2.5, bind_host="127.0.0.1"),
        HTTPTransport[dict[str, Any]](3, 1, bind_host="127.0.0.1"),
    ]
    try:
        got = [(t._timeout_s, t._num_chunks) for t in made]
    finally:
        for t in made:
            t.shutdown()
    assert got == [(10.0, 2), (10.0, 0), (2.5, None), (3.0, 1)]  # None: auto_chunks


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("10",), TypeError, "timeout must be a datetime.timedelta or a number of seconds"),
        ((True,), TypeError, "timeout must be .* got bool True"),
        ((0,), ValueError, "timeout must be positive, got 0"),
        ((timedelta(seconds=-1),), ValueError, "timeout must be positive, got -1 day"),
        ((float("nan"),), ValueError, "timeout must be a finite number of seconds, got nan"),
        ((T, 2.0), TypeError, "num_chunks must be an int or None, got float 2.0"),
        ((T, MAX_CHUNKS + 1), ValueError, f"num_chunks must be in \\[0, {MAX_CHUNKS}\\]"),
    ],
)
def test_constructor_rejects_bad_arguments(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        HTTPTransport(*args)


def test_never_allowed_fails_within_the_timeout(sender: HTTPTransport[dict[str, Any]]) -> None:
    r = receiver()
    start = time.monotonic()
    try:
        with pytest.raises(RecoveryError, match=r"step 2.*(not allowed|timed out)"):
            r.recv_checkpoint(0, sender.metadata(), 2, SHORT)
    finally:
        r.shutdown()
    # the design bound is timeout + 0.25 s grace; the slack absorbs a loaded 2-core CI box
    assert time.monotonic() - start < SHORT.total_seconds() + 1.5


def test_reader_waits_for_send_and_is_blocked_after_disallow(
    sender: HTTPTransport[dict[str, Any]],
) -> None:
    sd = state_dict()
    r = receiver()
    try:
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(r.recv_checkpoint, 0, sender.metadata(), 7, T)
            assert sender._gate.wait_for_waiting(1, timeout_s=10), (
                "the request must wait at the gate"
            )
            sender.send_checkpoint([1], 7, sd, T)
            check_same(sd, fut.result(timeout=10))
        sender.disallow_checkpoint()
        with pytest.raises(CheckpointTimeoutError, match=r"timed out.*503"):
            r.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=0.2))
    finally:
        r.shutdown()


def test_a_stalled_transfer_is_cut_off_by_the_socket_timeout() -> None:
    """A receiver stalled mid-stream must not keep the sender's snapshot pinned:
    `disallow_checkpoint` does not wait for it, and the server's socket timeout
    (the transport timeout) ends the transfer."""
    sender: HTTPTransport[dict[str, Any]] = HTTPTransport(SHORT, bind_host="127.0.0.1")
    try:
        sd = {"big": torch.randn(16 << 20)}  # 64 MB: more than the socket buffers hold
        sender.send_checkpoint([1], 1, sd, T)
        serial = _served_serial(sender, 1)
        with socket.create_connection(("127.0.0.1", sender.port), timeout=10) as s:
            s.sendall(
                f"GET /checkpoint/1/chunk/0/1?serial={serial}&wait_ms=1000 HTTP/1.0\r\n\r\n".encode()
            )
            assert s.recv(1024), "the stream started; now we stop reading"
            sender.disallow_checkpoint()
            assert sender._gate.wait_idle(timeout_s=10), "the stalled transfer was not cut off"
    finally:
        sender.shutdown()


def test_checksum_mismatch_raises(
    sender: HTTPTransport[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = http_fetch.piece_digest

    def corrupt_on_receive(piece: torch.Tensor) -> int:
        value = real(piece)
        return value ^ 1 if threading.current_thread().name.startswith("ckpt-fetch") else value

    monkeypatch.setattr(http_fetch, "piece_digest", corrupt_on_receive)
    sender.send_checkpoint([1], 1, state_dict(), T)
    r = receiver(num_chunks=2)
    try:
        with pytest.raises(RecoveryError, match="checksum mismatch in chunk"):
            r.recv_checkpoint(0, sender.metadata(), 1, T)
    finally:
        r.shutdown()


def test_in_place_receive_fills_existing_tensors(sender: HTTPTransport[dict[str, Any]]) -> None:
    sd = state_dict()
    mine = state_dict()
    before = {k: v.data_ptr() for k, v in mine["model"].items()}
    sender.send_checkpoint([1], 9, sd, T)
    r = receiver(num_chunks=2, state_dict=lambda: mine)
    try:
        out = r.recv_checkpoint(0, sender.metadata(), 9, T)
    finally:
        r.shutdown()
    check_same(sd, out)
    assert out["model"]["big"] is mine["model"]["big"]
    assert mine["model"]["big"].data_ptr() == before["big"] and torch.equal(
        mine["model"]["big"], sd["model"]["big"]
    )


class _EvilHandler(BaseHTTPRequestHandler):
    marker: Path

    def do_GET(self) -> None:
        marker = self.marker

        class Evil:
            def __reduce__(self) -> Any:
                return (Path.write_text, (marker, "pwned"))

        buf = io.BytesIO()
        torch.save({"format": FORMAT, "evil": Evil()}, buf)
        body = buf.getvalue()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_malicious_metadata_from_a_peer_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    handler = type("H", (_EvilHandler,), {"marker": marker})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    r = receiver()
    try:
        with pytest.raises(RecoveryError, match="refused checkpoint metadata"):
            r.recv_checkpoint(0, f"http://127.0.0.1:{srv.server_address[1]}/checkpoint/", 1, T)
    finally:
        r.shutdown()
        srv.shutdown()
        srv.server_close()
        thread.join(10)
    assert not marker.exists()


def test_advertised_address_is_configurable() -> None:
    t: HTTPTransport[dict[str, Any]] = HTTPTransport(
        T, bind_host="127.0.0.1", advertise_host="localhost"
    )
    r = receiver()
    try:
        assert t.metadata() == f"http://localhost:{t.port}/checkpoint/"
        sd = state_dict()
        t.send_checkpoint([1], 1, sd, T)
        check_same(sd, r.recv_checkpoint(0, t.metadata(), 1, T))
    finally:
        t.shutdown()
        r.shutdown()
    assert default_advertise_host("10.1.2.3") == "10.1.2.3"
    assert default_advertise_host("0.0.0.0") not in ("", "0.0.0.0")


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 support in this Python build")
    try:
        t: HTTPTransport[dict[str, Any]] = HTTPTransport(T, bind_host="::1")
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here: {exc}")
    r = receiver()
    try:
        assert t.metadata().startswith("http://[::1]:")
        t.send_checkpoint([1], 1, {"x": torch.arange(10)}, T)
        assert torch.equal(r.recv_checkpoint(0, t.metadata(), 1, T)["x"], torch.arange(10))
    finally:
        t.shutdown()
        r.shutdown()


def test_malformed_path_is_400(sender: HTTPTransport[dict[str, Any]]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sender.port, timeout=10)
    try:
        conn.request("GET", "/checkpoint/abc/meta")
        resp = conn.getresponse()
        assert resp.status == 400
        assert b"/checkpoint/<step>/meta" in resp.read()
    finally:
        conn.close()


def test_bad_metadata_argument_is_a_value_error() -> None:
    r = receiver()
    try:
        with pytest.raises(
            ValueError, match="metadata must be 'http://host:port/checkpoint/', got 'nope'"
        ):
            r.recv_checkpoint(0, "nope", 1, T)
    finally:
        r.shutdown()


@pytest.mark.gpu
def test_cuda_state_dict_is_served_from_cpu(sender: HTTPTransport[dict[str, Any]]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    sd: dict[str, Any] = {"w": torch.randn(1000, device="cuda"), "n": 1}
    sender.send_checkpoint([1], 1, sd, T)
    r = receiver()
    try:
        out = r.recv_checkpoint(0, sender.metadata(), 1, T)
    finally:
        r.shutdown()
    w = out["w"]
    assert isinstance(w, torch.Tensor)
    assert w.device.type == "cpu" and torch.equal(w, sd["w"].cpu())
