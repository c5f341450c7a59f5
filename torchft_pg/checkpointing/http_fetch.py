"""The receiving side of `HTTPTransport`: fetch the skeleton, then the chunks.

Each chunk is streamed piece by piece (`layout.iter_pieces`) straight into the
receive buffers, checksummed as it arrives, and compared with the sender's
8-byte trailer. With several chunks, one thread and connection per chunk; the
first real failure cancels the others and is the one reported.

Errors are `RecoveryError`s naming the peer and the step; two kinds are also
the `urllib` errors code written for torchft catches (its receiver fetches
with ``urllib``), and print as urllib's do:

* `CheckpointHTTPError` (also `urllib.error.HTTPError`, with ``code``): the
  peer refused the request. A wrong step (400 with
  `http_server.SERVED_STEP_HEADER`) says which step the peer serves and which
  was requested.
* `CheckpointTimeoutError` (also `TimeoutError` and `urllib.error.URLError`):
  the receiver's timeout was spent, including while the peer did not serve the
  step (a 503 with `http_server.NOT_SERVED_HEADER`: the peer's own wait is
  bounded by its timeout, so the receiver asks again while time is left).
"""

from __future__ import annotations

import http.client
import math
import socket
import threading
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from email.message import Message

import torch

from lighthouse import auth
from lighthouse.tls import TlsConfig, client_ssl_context, https_connection
from torchft_pg.checkpointing.http_server import NOT_SERVED_HEADER, SERVED_STEP_HEADER
from torchft_pg.checkpointing.layout import (
    Digest,
    byte_view,
    iter_pieces,
    piece_digest,
    plan_chunks,
)
from torchft_pg.checkpointing.skeleton import MAX_SKELETON_BYTES, Skeleton
from torchft_pg.checkpointing.transport import Deadline
from torchft_pg.errors import RecoveryError

__all__ = ["CheckpointHTTPError", "CheckpointTimeoutError", "ChunkFetcher"]

_GRACE_S = 0.25  # receiver socket slack beyond the server-side wait, seconds


class CheckpointHTTPError(RecoveryError, urllib.error.HTTPError):
    """The peer answered a checkpoint request with HTTP status `code`.

    Also a `urllib.error.HTTPError` (``code``, ``url``, ``headers``); `str()`
    is urllib's ``HTTP Error <code>: <message>``.
    """

    def __init__(self, message: str, *, url: str, code: int, headers: Message) -> None:
        urllib.error.HTTPError.__init__(self, url, code, message, headers, None)
        self.args = (message,)


class CheckpointTimeoutError(RecoveryError, urllib.error.URLError, TimeoutError):
    """A receive did not finish within its timeout (a zero timeout: at once).

    Also a `TimeoutError` and a `urllib.error.URLError` (``reason`` is the
    message); `str()` is urllib's ``<urlopen error <message>>``.
    """

    def __init__(self, message: str) -> None:
        urllib.error.URLError.__init__(self, message)
        self.args = (message,)


class _Cancelled(RecoveryError):
    """A chunk stopped because another chunk of the same receive failed."""


class ChunkFetcher:
    """One receive: the metadata request, then the chunk requests, under one deadline.

    `peer` names the sender in errors. Each request tells the server how long it
    may wait for the checkpoint (``wait_ms``, the time left); every socket
    operation is bounded by the time left plus a 0.25 s grace, so a receive
    fails at most that long after its deadline. With `tls` every request is
    HTTPS, the peer's certificate verified against the job's CA.
    """

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str,
        step: int,
        deadline: Deadline,
        peer: str,
        job_secret: str | None = None,
        tls: TlsConfig | None = None,
        healer: dict[str, str] | None = None,
    ) -> None:
        self.tls = tls
        # One context for every connection of this receive (loading the CA costs ~1 ms).
        self._tls_context = None if tls is None else client_ssl_context(tls)
        self.host, self.port, self.prefix, self.step = host, port, prefix, step
        self.deadline, self.peer = deadline, peer
        # Sent with every request when the job has a secret (see lighthouse.auth).
        self.headers = {} if job_secret is None else {auth.HTTP_HEADER: job_secret}
        self.headers.update(healer or {})  # which quorum and replica rank asks (named_healers)
        self.cancel = threading.Event()

    def _time_left(self) -> float:
        """Seconds left; `CheckpointTimeoutError` if none."""
        left = self.deadline.remaining()
        if left <= 0:
            raise self._timed_out("")
        return left

    def _timed_out(self, why: str) -> CheckpointTimeoutError:
        return CheckpointTimeoutError(
            f"receiving step {self.step} from {self.peer}: timed out after "
            f"{self.deadline.elapsed():.3f} s (timeout {self.deadline.timeout_s:.3f} s){why}"
        )

    def _open(
        self, path: str
    ) -> tuple[http.client.HTTPConnection, socket.socket, http.client.HTTPResponse]:
        """GET `path`; on a "not served within my wait" answer, ask again while time is left.

        Each request lets the server wait for the whole time left, so every
        attempt but the last lasts the server's own wait limit: the number of
        attempts is bounded by the timeout over that limit.
        """
        sep = "&" if "?" in path else "?"
        while True:
            left = self._time_left()
            wait_ms = max(1, math.ceil(left * 1000))
            target = f"{self.prefix}{self.step}/{path}{sep}wait_ms={wait_ms}"
            conn = self._connection(left + _GRACE_S)
            try:
                conn.request("GET", target, headers=self.headers)
                sock = (
                    conn.sock
                )  # getresponse() drops it from conn for HTTP/1.0; the response keeps it
                assert sock is not None
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise self._failed(f"request {path!r}", exc) from exc
            if resp.status == 200:
                return conn, sock, resp
            body = resp.read(4096).decode(errors="replace")
            conn.close()
            if resp.status == 503 and resp.getheader(NOT_SERVED_HEADER) is not None:
                if self.deadline.remaining() > 0:
                    continue
                raise self._timed_out(f"; the peer did not serve it (HTTP 503: {body})")
            raise self._refused(resp, target, path, body)

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        """A connection to the peer (not yet open), HTTPS if the job uses TLS;
        socket operations time out after `timeout_s` seconds."""
        if self.tls is None or self._tls_context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        return https_connection(self.host, self.port, timeout_s, self.tls, self._tls_context)

    def _refused(
        self, resp: http.client.HTTPResponse, target: str, path: str, body: str
    ) -> CheckpointHTTPError:
        host = f"[{self.host}]" if ":" in self.host else self.host
        url = f"{'http' if self.tls is None else 'https'}://{host}:{self.port}{target}"
        served = resp.getheader(SERVED_STEP_HEADER)
        if resp.status == 400 and served is not None and served.lstrip("-").isdigit():
            message = (
                f"{self.peer} serves step {int(served)}, not the requested step {self.step} "
                f"({path}: serving {int(served)} but got step={self.step})"
            )
        else:
            message = f"{self.peer} refused {path} of step {self.step}: {body}"
        return CheckpointHTTPError(message, url=url, code=resp.status, headers=resp.msg)

    def _failed(self, what: str, exc: BaseException) -> RecoveryError:
        if isinstance(exc, TimeoutError):  # a socket timeout: the time left ran out
            return self._timed_out(f" ({what}: {exc})")
        return RecoveryError(
            f"{what} for step {self.step} from {self.peer} failed after {self.deadline.elapsed():.3f} s "
            f"(timeout {self.deadline.timeout_s:.3f} s): {type(exc).__name__}: {exc}"
        )

    def get_meta(self) -> bytes:
        conn, _, resp = self._open("meta")
        try:
            if resp.length is None or resp.length > MAX_SKELETON_BYTES:
                raise RecoveryError(
                    f"{self.peer} announced {resp.length} bytes of metadata for step {self.step}"
                    f" (limit {MAX_SKELETON_BYTES})"
                )
            return resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed("reading metadata", exc) from exc
        finally:
            conn.close()

    def get_chunks(self, skeleton: Skeleton, blobs: list[torch.Tensor], n: int) -> None:
        if n == 1:
            self._chunk(skeleton, blobs, 0, 1)
            return
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ckpt-fetch") as pool:
            futures = [pool.submit(self._chunk, skeleton, blobs, i, n) for i in range(n)]
            errors = [f.exception() for f in futures]  # waits for all; each is deadline-bounded
        real = [e for e in errors if e is not None and not isinstance(e, _Cancelled)]
        first = real[0] if real else next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _chunk(self, skeleton: Skeleton, blobs: list[torch.Tensor], i: int, n: int) -> None:
        segments = plan_chunks(skeleton.blob_sizes, n)[i]
        if not segments:
            return
        try:
            conn, sock, resp = self._open(f"chunk/{i}/{n}?serial={skeleton.serial}")
        except BaseException:
            self.cancel.set()
            raise
        digest = Digest()
        try:
            expected = sum(s.length for s in segments) + 8
            if resp.length != expected:
                raise RecoveryError(
                    f"{self.peer} sends {resp.length} bytes for chunk {i}/{n} of step {self.step},"
                    f" expected {expected}"
                )
            for seg in segments:
                for p in iter_pieces(seg):
                    if self.cancel.is_set():
                        raise _Cancelled(f"chunk {i}/{n} cancelled: another chunk failed")
                    view = blobs[p.blob][p.offset : p.offset + p.length]
                    self._read_exact(sock, resp, byte_view(view))
                    digest.update(piece_digest(view))
            trailer = bytearray(8)
            self._read_exact(sock, resp, memoryview(trailer))
        except RecoveryError:  # ours (some are OSErrors too): as raised
            self.cancel.set()
            raise
        except (OSError, http.client.HTTPException) as exc:
            self.cancel.set()
            raise self._failed(f"reading chunk {i}/{n}", exc) from exc
        except BaseException:
            self.cancel.set()
            raise
        finally:
            resp.close()
            conn.close()
        sent = int.from_bytes(trailer, "little")
        if sent != digest.value:
            self.cancel.set()
            raise RecoveryError(
                f"checksum mismatch in chunk {i}/{n} of step {self.step} from {self.peer}: "
                f"sender {sent:#018x}, received {digest.value:#018x}"
            )

    def _read_exact(
        self, sock: socket.socket, resp: http.client.HTTPResponse, buf: memoryview
    ) -> None:
        got = 0
        while got < len(buf):
            sock.settimeout(self._time_left() + _GRACE_S)
            k = resp.readinto(buf[got:])
            if not k:
                raise RecoveryError(
                    f"{self.peer} closed the connection for step {self.step} after {got} of {len(buf)} bytes "
                    "of a piece (sender disallowed the checkpoint, died, or timed out)"
                )
            got += k
