"""HTTPTransport's bytes on the wire: checksums end to end, chunk coverage, chunk count.

Real sockets throughout: a relay between receiver and sender that flips one bit
of what it forwards, raw HTTP requests for every chunk of a plan, and the
receiver's own log of how many chunks it fetched.
"""

from __future__ import annotations

import http.client
import logging
import re
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchft_pg.checkpointing.http_transport as http_transport
from torchft_pg.checkpointing import HTTPTransport
from torchft_pg.checkpointing.layout import (
    PIECE_BYTES,
    Digest,
    iter_pieces,
    piece_digest,
    plan_chunks,
)
from torchft_pg.checkpointing.serialization import unpack
from torchft_pg.checkpointing.skeleton import decode_skeleton
from torchft_pg.errors import RecoveryError

T = timedelta(seconds=20)


def state_dict() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {
        "big": torch.randn(3 * PIECE_BYTES // 4 + 1000, generator=g),  # 3 pieces and a bit
        "other": torch.randn(PIECE_BYTES // 4, generator=g),
        "small": torch.randn(300, generator=g),
        "step": 4,
    }


def check_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert torch.equal(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k], k


@pytest.fixture
def sender() -> Iterator[HTTPTransport[dict[str, Any]]]:
    t: HTTPTransport[dict[str, Any]] = HTTPTransport(T, bind_host="127.0.0.1")
    try:
        yield t
    finally:
        t.shutdown()


def receiver(**kw: Any) -> HTTPTransport[dict[str, Any]]:
    return HTTPTransport(T, bind_host="127.0.0.1", **kw)


class FlippingRelay:
    """A TCP relay in front of a checkpoint server. Each chunk response (its whole
    body read first: the server closes after one response) gets byte `at` of its
    body XORed with `mask` before it is forwarded; everything else passes as is."""

    def __init__(self, upstream_port: int, at: int, mask: int) -> None:
        self.upstream_port, self.at, self.mask = upstream_port, at, mask
        self.flipped = 0  # chunk responses altered
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._srv.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/checkpoint/"

    def close(self) -> None:
        self._srv.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self._srv.close()
        self._thread.join(10)
        assert not self._thread.is_alive()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            self._forward(client)
        except OSError:  # the receiver gave up on this chunk (another one failed first)
            pass
        finally:
            client.close()

    def _forward(self, client: socket.socket) -> None:
        client.settimeout(15)
        with socket.create_connection(("127.0.0.1", self.upstream_port), 15) as up:
            request = b""
            while b"\r\n\r\n" not in request:
                data = client.recv(65536)
                if not data:
                    return
                request += data
            up.sendall(request)
            response = bytearray()
            while data := up.recv(1 << 20):
                response += data
            body = response.index(b"\r\n\r\n") + 4
            if b"/chunk/" in request.split(b"\r\n", 1)[0] and len(response) > body + self.at:
                response[body + self.at] ^= self.mask
                self.flipped += 1
            client.sendall(response)


@pytest.mark.parametrize("num_chunks", [0, 3])
@pytest.mark.parametrize(
    ("at", "mask"),
    [
        # The top bit of the first word of the first 4 KiB block: the sign of an
        # fp32, and a flip the checksum used to miss (its block weight is odd).
        (7, 0x80),
        (PIECE_BYTES + 12_345, 0x08),  # inside the second piece
    ],
)
def test_a_bit_flipped_in_transit_is_detected(
    sender: HTTPTransport[dict[str, Any]], num_chunks: int, at: int, mask: int
) -> None:
    """The server sends straight from the snapshot's memory with checksums kept
    per snapshot; one bit changed on the way still fails the receive."""
    sd = state_dict()
    sender.send_checkpoint([1], 3, sd, T)
    relay = FlippingRelay(sender.port, at, mask)
    r = receiver(num_chunks=num_chunks)
    try:
        with pytest.raises(RecoveryError, match="checksum mismatch in chunk"):
            r.recv_checkpoint(0, relay.url(), 3, T)
        assert relay.flipped >= 1
        relay.mask = 0  # the same relay, nothing altered: the receive succeeds
        check_same(sd, r.recv_checkpoint(0, relay.url(), 3, T))
    finally:
        r.shutdown()
        relay.close()


def test_a_bit_flipped_in_the_served_snapshot_is_detected(
    sender: HTTPTransport[dict[str, Any]],
) -> None:
    """The kept checksums are those of the snapshot as it was copied: a bit that
    changes in its memory afterwards is caught at the receiver too."""
    sd = state_dict()
    sender.send_checkpoint([1], 3, sd, T)
    r = receiver(num_chunks=0)
    try:
        check_same(sd, r.recv_checkpoint(0, sender.metadata(), 3, T))  # every digest now kept
        with sender._gate.read(3, wait_s=5) as packed:
            packed.blobs[0][PIECE_BYTES + 7] ^= 0x80
        with pytest.raises(RecoveryError, match="checksum mismatch in chunk 0/1"):
            r.recv_checkpoint(0, sender.metadata(), 3, T)
    finally:
        r.shutdown()


def _get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == 200, (path, resp.status)
        body = resp.read()
        assert len(body) == int(resp.getheader("Content-Length", "-1"))
        return body
    finally:
        conn.close()


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_parallel_chunks_cover_the_payload_exactly_once(
    sender: HTTPTransport[dict[str, Any]], n: int
) -> None:
    """Every chunk of an n-chunk plan, fetched over its own connection: their
    bodies put back where the plan says fill every blob byte exactly once, and
    each trailer is the fold of its own body's piece checksums."""
    sd = state_dict()
    sender.send_checkpoint([1], 3, sd, T)
    skeleton = decode_skeleton(_get(sender.port, "/checkpoint/3/meta"))
    sizes = skeleton.blob_sizes
    blobs = [torch.zeros(s, dtype=torch.uint8) for s in sizes]
    written = [torch.zeros(s, dtype=torch.int32) for s in sizes]
    for i, segments in enumerate(plan_chunks(sizes, n)):
        body = _get(sender.port, f"/checkpoint/3/chunk/{i}/{n}?serial={skeleton.serial}")
        data = torch.frombuffer(bytearray(body[:-8]), dtype=torch.uint8)
        assert data.numel() == sum(s.length for s in segments)
        digest, pos = Digest(), 0
        for seg in segments:
            for p in iter_pieces(seg):
                part = data[pos + p.offset - seg.offset : pos + p.offset - seg.offset + p.length]
                digest.update(piece_digest(part))
            blobs[seg.blob][seg.offset : seg.offset + seg.length] = data[pos : pos + seg.length]
            written[seg.blob][seg.offset : seg.offset + seg.length] += 1
            pos += seg.length
        assert int.from_bytes(body[-8:], "little") == digest.value, f"trailer of chunk {i}/{n}"
    assert all(bool((w == 1).all()) for w in written), "every byte exactly once"
    check_same(sd, unpack(skeleton, blobs))


def test_auto_chunks_picks_by_size_and_cpus() -> None:
    mib = 1 << 20
    auto = http_transport.auto_chunks
    assert auto(0, cpus=16) == 1
    assert auto(100 * mib, cpus=16) == 1, "a small payload keeps one connection"
    assert auto(400 * mib, cpus=16) == 400 * mib // http_transport.AUTO_CHUNK_BYTES
    assert auto(400 * mib, cpus=2) == 2, "no more connections than CPUs"
    assert auto(1 << 40, cpus=64) == http_transport.AUTO_MAX_CHUNKS
    assert auto(1 << 40, cpus=1) == 1


def test_default_receive_fetches_the_auto_chunk_count(
    sender: HTTPTransport[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without num_chunks the receiver fetches `auto_chunks(payload)` chunks (the
    bytes per chunk scaled down so a 16 MiB payload makes several), and an
    explicit 0 still means one stream, as in torchft."""
    monkeypatch.setattr(http_transport, "AUTO_CHUNK_BYTES", 4 << 20)
    sd = state_dict()
    sender.send_checkpoint([1], 3, sd, T)
    payload = sum(t.numel() * 4 for t in sd.values() if isinstance(t, torch.Tensor))
    expected = http_transport.auto_chunks(payload)
    for kw, chunks in (({}, expected), ({"num_chunks": 0}, 1)):
        r = receiver(**kw)
        try:
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="torchft_pg.checkpointing"):
                check_same(sd, r.recv_checkpoint(0, sender.metadata(), 3, T))
        finally:
            r.shutdown()
        line = next(m for m in caplog.messages if "received" in m)
        assert re.search(rf"\bchunks={chunks}\b", line), (kw, line)
