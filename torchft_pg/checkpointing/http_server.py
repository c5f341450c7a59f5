"""The serving side of `HTTPTransport`: a threaded HTTP server over a `ServingGate`.

Endpoints (all GET):

* ``/checkpoint/{step}/meta?wait_ms=W`` — the skeleton (`serialization`).
* ``/checkpoint/{step}/chunk/{i}/{n}?serial=S&wait_ms=W`` — chunk `i` of `n`
  (`layout.plan_chunks`): the raw blob bytes, then an 8-byte little-endian
  checksum of what was sent (`layout.piece_digest` folded by `layout.Digest`).
  The bytes go to the socket straight from the snapshot's memory (no copy in
  Python), and the piece checksums are the snapshot's own (`Packed.digests`):
  computed once per snapshot, by `HTTPTransport` on a thread of its own as
  soon as it serves, or here for a piece not reached yet.

A request waits up to ``min(W ms, server timeout)`` for serving to be allowed.
The bytes served are a snapshot (see `ServingGate`): a chunk already streaming
when serving is disallowed goes on to its end, and is cut off only when a newer
checkpoint is served (`CheckpointServer.cut_streams`), the receiver stalls past
the server timeout, or the server shuts down.
Answers other than 200:

* ``400`` — a malformed path, or a step other than the one served; the latter
  names both steps in its body and carries the served step in the
  `SERVED_STEP_HEADER` header, so the receiver can report it exactly;
* ``401`` — no job secret, when the job has one (`lighthouse.auth`);
* ``403`` — a request not from a healer the quorum named (`named_healers`),
  when the owner said which quorum it serves in; a request naming a later
  quorum is answered once the owner serves in it (within the request's wait);
* ``409`` — a chunk request whose ``serial`` is not the served checkpoint's
  (it was re-sent or re-allowed since the receiver read the metadata);
* ``503`` — serving was not allowed within the wait (with the
  `NOT_SERVED_HEADER` header: the receiver may ask again while its own timeout
  lasts), or the server shuts down (without it);
* ``500`` — an unexpected error on the server.

With an ``ssl.SSLContext`` the server speaks HTTPS only. The TLS handshake
runs on the request's own thread, bounded by the server timeout, so a client
that never completes it (or speaks plain HTTP) holds up nobody else.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lighthouse import auth
from torchft_pg.checkpointing.gate import (
    GateClosedError,
    NotAllowedError,
    ServingGate,
    WrongStepError,
)
from torchft_pg.checkpointing.layout import (
    Digest,
    Segment,
    byte_view,
    iter_pieces,
    piece_digest,
    plan_chunks,
)
from torchft_pg.checkpointing.named_healers import (
    QUORUM_HEADER,
    REPLICA_RANK_HEADER,
    NamedHealers,
)
from torchft_pg.checkpointing.serialization import Packed
from torchft_pg.checkpointing.transport import logger

__all__ = [
    "MAX_CHUNKS",
    "NOT_SERVED_HEADER",
    "SERVED_STEP_HEADER",
    "CheckpointServer",
    "parse_path",
]

#: Most chunks a checkpoint may be split into (bounds the server's per-request plan).
MAX_CHUNKS = 256
#: Response header of a wrong-step answer: the step this server serves.
SERVED_STEP_HEADER = "X-Checkpoint-Served-Step"
#: Response header of a 503 for a checkpoint not served within the request's wait:
#: the seconds waited.
NOT_SERVED_HEADER = "X-Checkpoint-Not-Served-Within"


class CheckpointServer(ThreadingHTTPServer):
    """Serves the checkpoint open in `gate` on `addr` (port 0 = ephemeral).

    `timeout_s` (seconds) is the socket timeout for a stalled receiver and
    the longest a request waits for the gate to open. `streaming` maps each
    chunk transfer's connection to the checkpoint it sends, so the owner can
    cut transfers off (`cut_streams`). With `tls_context` every connection
    is HTTPS (the handshake on the request's thread, see the module docstring).
    """

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(
        self,
        addr: tuple[str, int],
        gate: ServingGate[Packed],
        timeout_s: float,
        job_secret: str | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.tls_context = tls_context
        self.address_family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.job_secret = job_secret  # every request must present it (None: unchecked)
        # Who the checkpoint is served to (None: anyone with the secret, if one is set).
        self._healers: NamedHealers | None = None
        self._healers_changed = threading.Condition()
        self.gate = gate
        self.timeout_s = timeout_s
        self.streaming: dict[socket.socket, Packed] = {}
        self.streaming_lock = threading.Lock()
        super().__init__(addr, _Handler)

    @property
    def healers(self) -> NamedHealers | None:
        return self._healers

    @healers.setter
    def healers(self, healers: NamedHealers | None) -> None:
        with self._healers_changed:
            self._healers = healers
            self._healers_changed.notify_all()

    def refusal(self, quorum: str | None, replica_rank: str | None, wait_s: float) -> str | None:
        """Why a request with these header values may not read now, or None.

        A healer can ask before its source has entered the quorum that named
        it (the source is still serving in the one before, for the same step):
        a request naming another quorum than the served one waits up to
        `wait_s` seconds for the source to serve in it, as a request for a step
        not yet served waits for that step. Refused at once without a quorum
        header or naming an older quorum of the same epoch, and after `wait_s`
        if the source never serves in the quorum named.
        """
        deadline = time.monotonic() + wait_s
        with self._healers_changed:
            while True:
                healers = self._healers
                if healers is None:
                    return None
                refusal = healers.refusal(quorum, replica_rank)
                left = deadline - time.monotonic()
                if refusal is None or quorum is None or quorum == healers.quorum or left <= 0:
                    return refusal
                if not healers.may_come(quorum):  # a stale healer: nothing to wait for
                    return refusal
                self._healers_changed.wait(left)

    def cut_streams(self, keep: Packed | None) -> int:
        """Shut down every chunk transfer sending a checkpoint other than `keep`
        (None: every one); a transfer blocked on a stalled receiver wakes with an
        error and drops its checkpoint. Returns how many were cut."""
        with self.streaming_lock:
            stale = [s for s, p in self.streaming.items() if p is not keep]
        for sock in stale:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return len(stale)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls_context is None:
            return sock, addr
        # The handshake waits for the client: not here on the accept loop, but on the
        # request's thread (`_Handler.handle`).
        return self.tls_context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), addr

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup we do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )


class _Abort(Exception):
    """Stop streaming: a newer checkpoint replaced this one mid-transfer, or shutdown."""


def parse_path(path: str) -> tuple[int, str, int, int, dict[str, str]]:
    """``/checkpoint/{step}/meta`` or ``.../chunk/{i}/{n}`` → (step, kind, i, n, query).

    `ValueError` naming the path and the expected forms otherwise.
    """
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
    server: CheckpointServer
    protocol_version = "HTTP/1.0"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)

    def handle(self) -> None:
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                logger.warning(
                    "checkpoint request from %s: TLS handshake failed (%s)",
                    self.address_string(),
                    exc,
                )
                self.close_connection = True
                return
        super().handle()

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http %s " + format, self.address_string(), *args)

    def _error(self, code: int, msg: str, headers: dict[str, str] | None = None) -> None:
        body = msg.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        server = self.server
        secret = server.job_secret
        if secret is not None and not auth.header_presents(
            self.headers.get(auth.HTTP_HEADER), secret
        ):
            logger.warning(
                "checkpoint request from %s without the job secret", self.address_string()
            )
            self._error(401, f"this job's checkpoints require its job secret ({auth.SECRET_ENV})")
            return
        try:
            step, kind, i, n, query = parse_path(self.path)
            wait_s = min(server.timeout_s, max(0.0, int(query.get("wait_ms", "0")) / 1000))
        except ValueError as exc:
            self._error(400, str(exc))
            return
        started = time.monotonic()
        refusal = server.refusal(
            self.headers.get(QUORUM_HEADER), self.headers.get(REPLICA_RANK_HEADER), wait_s
        )
        if refusal is not None:
            logger.warning("checkpoint request from %s refused: %s", self.address_string(), refusal)
            self._error(403, refusal)
            return
        wait_s = max(0.0, wait_s - (time.monotonic() - started))
        try:
            with server.gate.read(step, wait_s) as packed:
                if kind == "meta":
                    self._send_meta(packed)
                elif query.get("serial") != packed.skeleton.serial:
                    self._error(
                        409, f"checkpoint of step {step} changed since its metadata was read"
                    )
                else:
                    self._send_chunk(packed, i, n)
        except WrongStepError as exc:
            self._error(400, str(exc), {SERVED_STEP_HEADER: str(exc.serving)})
        except NotAllowedError as exc:
            self._error(
                503,
                f"step {step}: {exc} (send_checkpoint not called, or disallowed)",
                {NOT_SERVED_HEADER: f"{wait_s:.3f}"},
            )
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
        server = self.server
        with server.streaming_lock:  # registered before the first check: see `cut_streams`
            server.streaming[self.connection] = packed
        try:
            start = time.monotonic()
            self._stream(packed, segments)
        finally:
            with server.streaming_lock:
                server.streaming.pop(self.connection, None)
        nbytes, secs = sum(s.length for s in segments), time.monotonic() - start
        logger.debug(
            "served step=%d chunk %d/%d bytes=%d seconds=%.4f", packed.step, i, n, nbytes, secs
        )

    def _stream(self, packed: Packed, segments: list[Segment]) -> None:
        gate, digest, known = self.server.gate, Digest(), packed.digests
        for seg in segments:
            for p in iter_pieces(seg):
                if not gate.may_continue(packed):
                    raise _Abort("a newer checkpoint replaced this one mid-transfer")
                view = packed.blobs[p.blob][p.offset : p.offset + p.length]
                self.wfile.write(byte_view(view))  # sendall from the tensor's memory
                digest.update(known.of(p) if known is not None else piece_digest(view))
        self.wfile.write(digest.value.to_bytes(8, "little"))
