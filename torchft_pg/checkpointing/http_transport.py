"""HTTPTransport: serve a state dict over HTTP; receivers pull it, streamed and chunked.

The sender runs a threaded HTTP server on an ephemeral port. Endpoints (all GET):

* ``/checkpoint/{step}/meta?wait_ms=W`` — the skeleton (`serialization`).
* ``/checkpoint/{step}/chunk/{i}/{n}?serial=S&wait_ms=W`` — chunk `i` of `n`
  (`layout.plan_chunks`): the raw blob bytes, then an 8-byte little-endian
  checksum of what was sent (`layout.piece_digest` folded by `layout.Digest`).

A request waits up to ``min(W ms, transport timeout)`` for serving to be allowed
(`gate.ServingGate`); a wrong step is ``409`` and names both steps, a checkpoint
that never became available is ``503``, a malformed path ``400``. The receiver
streams each piece straight into preallocated tensors (or into its own tensors
when `state_dict` is given) and checks every checksum; with ``num_chunks > 0``
it fetches that many chunks in parallel over separate connections.

The advertised address is configurable: the peer advertised
`socket.gethostname()`, which resolved to the wrong network on multi-fabric
clusters. Pass `advertise_host` (the address of the NIC heals should use).
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

import torch

from torchft_pg.checkpointing.gate import (
    GateClosedError,
    NotAllowedError,
    ServingGate,
    WrongStepError,
)
from torchft_pg.checkpointing.http_fetch import ChunkFetcher
from torchft_pg.checkpointing.layout import (
    Digest,
    byte_view,
    iter_pieces,
    piece_digest,
    plan_chunks,
)
from torchft_pg.checkpointing.serialization import (
    Packed,
    decode_skeleton,
    pack,
    prepare_receive,
    unpack,
)
from torchft_pg.checkpointing.transport import CheckpointTransport, Deadline, log_transfer, logger
from torchft_pg.errors import RecoveryError

__all__ = ["MAX_CHUNKS", "HTTPTransport", "default_advertise_host"]

T = TypeVar("T")
_WILDCARDS = ("", "0.0.0.0", "::")
#: Most chunks a checkpoint may be split into (bounds the server's per-request plan).
MAX_CHUNKS = 256


def default_advertise_host(bind_host: str) -> str:
    """The address to advertise when the caller gives none.

    A specific `bind_host` is advertised as is. For a wildcard bind, the source
    address of the default route (found with an unconnected UDP socket; no
    packet is sent), else 127.0.0.1. Multi-NIC hosts should pass
    `advertise_host` explicitly.
    """
    if bind_host not in _WILDCARDS:
        return bind_host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing lookup only
            addr = str(s.getsockname()[0])
            return addr if addr != "0.0.0.0" else "127.0.0.1"
    except OSError:
        return "127.0.0.1"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], transport: HTTPTransport[Any]) -> None:
        self.address_family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.transport = transport
        self.active: set[socket.socket] = set()
        self.active_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup we do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )


class _Abort(Exception):
    """Stop streaming: the checkpoint was disallowed or replaced mid-transfer."""


def _parse(path: str) -> tuple[int, str, int, int, dict[str, str]]:
    """``/checkpoint/{step}/meta`` or ``.../chunk/{i}/{n}`` → (step, kind, i, n, query)."""
    url = urllib.parse.urlsplit(path)
    parts = url.path.strip("/").split("/")
    query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
    usage = (
        f"path must be /checkpoint/<step>/meta or /checkpoint/<step>/chunk/<i>/<n>, got {path!r}"
    )
    try:
        if len(parts) == 3 and parts[0] == "checkpoint" and parts[2] == "meta":
            return int(parts[1]), "meta", 0, 1, query
        if len(parts) == 5 and parts[0] == "checkpoint" and parts[2] == "chunk":
            step, i, n = int(parts[1]), int(parts[3]), int(parts[4])
            if 0 <= i < n <= MAX_CHUNKS:
                return step, "chunk", i, n, query
    except ValueError as exc:
        raise ValueError(usage) from exc
    raise ValueError(usage)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.transport._timeout_s)
        with self.server.active_lock:
            self.server.active.add(self.connection)

    def finish(self) -> None:
        with self.server.active_lock:
            self.server.active.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http %s " + format, self.address_string(), *args)

    def _error(self, code: int, msg: str) -> None:
        body = msg.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        transport = self.server.transport
        try:
            step, kind, i, n, query = _parse(self.path)
            wait_s = min(transport._timeout_s, max(0.0, int(query.get("wait_ms", "0")) / 1000))
        except ValueError as exc:
            self._error(400, str(exc))
            return
        try:
            with transport._gate.read(step, wait_s) as packed:
                if kind == "meta":
                    self._send_meta(packed)
                elif query.get("serial") != packed.skeleton.serial:
                    self._error(
                        409, f"checkpoint of step {step} changed since its metadata was read"
                    )
                else:
                    self._send_chunk(packed, i, n)
        except WrongStepError as exc:
            self._error(409, str(exc))
        except NotAllowedError as exc:
            self._error(503, f"step {step}: {exc} (send_checkpoint not called, or disallowed)")
        except GateClosedError as exc:
            self._error(503, str(exc))
        except (_Abort, OSError) as exc:
            logger.debug("http %s: transfer stopped: %r", self.address_string(), exc)
            self.close_connection = True
        except Exception as exc:
            logger.exception("checkpoint server error on %s", self.path)
            self.close_connection = True
            with contextlib.suppress(OSError):  # headers may already be out; then the
                self._error(500, f"{type(exc).__name__}: {exc}")  # receiver sees a bad body

    def _send_meta(self, packed: Packed) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(packed.skeleton_bytes)))
        self.end_headers()
        self.wfile.write(packed.skeleton_bytes)

    def _send_chunk(self, packed: Packed, i: int, n: int) -> None:
        segments = plan_chunks(packed.skeleton.blob_sizes, n)[i]
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(sum(s.length for s in segments) + 8))
        self.end_headers()
        gate, digest, start = self.server.transport._gate, Digest(), time.monotonic()
        for seg in segments:
            for p in iter_pieces(seg):
                if not gate.is_current(packed):
                    raise _Abort("checkpoint disallowed mid-transfer")
                view = packed.blobs[p.blob][p.offset : p.offset + p.length]
                self.wfile.write(byte_view(view))
                digest.update(piece_digest(view))
        self.wfile.write(digest.value.to_bytes(8, "little"))
        nbytes, secs = sum(s.length for s in segments), time.monotonic() - start
        logger.debug(
            "served step=%d chunk %d/%d bytes=%d seconds=%.4f", packed.step, i, n, nbytes, secs
        )


class HTTPTransport(CheckpointTransport[T], Generic[T]):
    """Serve and fetch checkpoints over HTTP (see module docstring).

    Args:
        timeout: how long a request waits for serving to be allowed, the socket
            timeout for a stalled receiver, and how long `disallow_checkpoint`
            waits for in-flight transfers before cutting them off.
        num_chunks: receive in this many parallel chunks/connections; 0 means one
            streamed request.
        bind_host: address to listen on ("0.0.0.0" = every IPv4 interface; an
            IPv6 literal listens on IPv6). The port is ephemeral. There is no
            authentication: bind to the network heals should use.
        advertise_host: the address put into `metadata()`; default
            `default_advertise_host(bind_host)`.
        state_dict: optional callable returning the receiver's current state
            dict; matching tensors (same path, dtype, shape) are received in place.
    """

    def __init__(
        self,
        timeout: timedelta,
        num_chunks: int = 0,
        bind_host: str = "0.0.0.0",
        advertise_host: str | None = None,
        state_dict: Callable[[], T] | None = None,
    ) -> None:
        if timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout}")
        if not 0 <= num_chunks <= MAX_CHUNKS:
            raise ValueError(f"num_chunks must be in [0, {MAX_CHUNKS}], got {num_chunks}")
        self._timeout_s = timeout.total_seconds()
        self._num_chunks = num_chunks
        self._state_dict = state_dict
        self._gate: ServingGate[Packed] = ServingGate()
        self._server = _Server((bind_host, 0), self)
        self._host = advertise_host or default_advertise_host(bind_host)
        self._port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="ckpt-http",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    @property
    def port(self) -> int:
        return self._port

    def metadata(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}/checkpoint/"

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        """Serve `state_dict` as `step` until `disallow_checkpoint` (pull model: `dst_ranks` unused).

        Large CPU tensors are served from their own memory (no copy), tensors
        under 1 MiB from one combined copy, accelerator tensors from a CPU copy.
        Returns at once; `timeout` is unused.
        """
        del dst_ranks, timeout
        packed = pack(state_dict, step)
        if any(b.device.type != "cpu" for b in packed.blobs):
            packed.blobs = [b.cpu() for b in packed.blobs]
        self._gate.allow(step, packed)
        logger.info(
            "checkpoint serving step=%d bytes=%d at %s", step, packed.nbytes, self.metadata()
        )

    def disallow_checkpoint(self) -> None:
        """Stop serving; wait up to `timeout` for transfers to end, then cut them off."""
        if self._gate.disallow(self._timeout_s):
            return
        with self._server.active_lock:
            stuck = list(self._server.active)
        logger.warning(
            "checkpoint: %d transfers still running after %.3f s; closing them",
            len(stuck),
            self._timeout_s,
        )
        for sock in stuck:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if not self._gate.disallow(self._timeout_s):
            raise RecoveryError(
                f"checkpoint transfers did not stop within {2 * self._timeout_s:.3f} s"
            )

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        """Fetch the state dict of `step` from the server at `metadata` within `timeout`."""
        deadline = Deadline(timeout)
        url = urllib.parse.urlsplit(metadata)
        if url.scheme != "http" or not url.hostname or not url.port or not url.path.endswith("/"):
            raise ValueError(f"metadata must be 'http://host:port/checkpoint/', got {metadata!r}")
        fetch = ChunkFetcher(
            url.hostname, url.port, url.path, step, deadline, f"rank {src_rank} at {metadata}"
        )
        skeleton = decode_skeleton(fetch.get_meta())
        if skeleton.step != step:
            raise RecoveryError(f"{fetch.peer} sent step {skeleton.step}, expected step {step}")
        template = self._state_dict() if self._state_dict is not None else None
        dests, direct, blobs = prepare_receive(skeleton, template, torch.device("cpu"))
        n = max(1, self._num_chunks)
        fetch.get_chunks(skeleton, blobs, n)
        result = unpack(skeleton, blobs, dests)
        log_transfer(
            "received",
            fetch.peer,
            step,
            sum(skeleton.blob_sizes),
            deadline.elapsed(),
            f"chunks={n} tensors={len(skeleton.tensors)} in_place_blobs={len(direct)} checksum=ok",
        )
        return result  # type: ignore[no-any-return]

    def shutdown(self, wait: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._gate.shutdown()
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join(timeout=self._timeout_s)
