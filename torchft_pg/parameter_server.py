"""`ParameterServer`: a server that talks to each client over a fresh two-rank process group
(torchft's interface).

A client asks the server's HTTP address for a session; the server answers with
a session id and a store address, then configures a new process group there
as rank 0 and runs `forward(session_id, pg)` on a thread of its own, while the
client (`new_session`) configures its group at the same address as rank 1.
Each session's group is reconfigurable and shut down when `forward` returns
or fails, so one broken client costs only its own session.

Subclasses implement `new_process_group` (an unconfigured group, e.g.
``ProcessGroupGloo()``) and `forward`. Beyond torchft: the server binds where
`bind_host` says (loopback by default; the answer names the store on the
same host), a configured job secret is required of every session request and
sent by `new_session`, and at most `max_sessions` sessions run at once (503
beyond, so a flood of requests cannot start unbounded threads).
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from torch.distributed import TCPStore

from lighthouse import auth
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["ParameterServer"]

logger = logging.getLogger(__name__)

SESSION_PATH = "/new_session"
DEFAULT_MAX_SESSIONS = 64
DEFAULT_TIMEOUT = timedelta(seconds=60)


class ParameterServer(ABC):
    """Serves sessions, one process group per client (see the module docstring).

    Args:
        port: the HTTP port (0: any free one).
        store_port: the port of the TCPStore sessions meet on (0: any free one).
        bind_host: the address both listen on (default loopback; ``0.0.0.0`` or
            ``::`` for every interface, then set a job secret).
        job_secret: required of every session request (default:
            ``$TORCHFT_JOB_SECRET`` or the file in ``$TORCHFT_JOB_SECRET_FILE``;
            none: unchecked).
        max_sessions: sessions running at once; more are refused with 503.
        timeout: bounds the store and each session's `configure`.
    """

    def __init__(
        self,
        port: int,
        store_port: int = 0,
        *,
        bind_host: str = "127.0.0.1",
        job_secret: str | None = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        timeout: timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        for name, value in (("port", port), ("store_port", store_port)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
                raise ValueError(f"{name} must be an int in [0, 65535], got {value!r}")
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        self._secret = auth.resolve_job_secret(job_secret)
        auth.warn_if_exposed(logger, "the parameter server", bind_host, self._secret)
        self._timeout = timeout
        self._host = bind_host
        self.store = TCPStore(
            host_name=bind_host,
            port=store_port,
            is_master=True,
            wait_for_workers=False,
            timeout=timeout,
        )
        self._slots = threading.BoundedSemaphore(max_sessions)
        self._server = _SessionServer((bind_host, port), _handler(self))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="parameter-server", daemon=True
        )
        self._thread.start()
        logger.info("parameter server at %s", self.address())

    def address(self) -> str:
        """``http://host:port/new_session``: what clients pass to `new_session`."""
        return f"http://{_url_host(self._host)}:{self._server.server_address[1]}{SESSION_PATH}"

    def shutdown(self) -> None:
        """Stop accepting sessions (running ones end with their `forward`)."""
        self._server.shutdown()
        self._server.server_close()

    @classmethod
    @abstractmethod
    def new_process_group(cls) -> ProcessGroup:
        """A new, unconfigured process group for one session (both sides use it)."""

    @abstractmethod
    def forward(self, session_id: str, pg: ProcessGroup) -> None:
        """Serve one session on `pg` (this server is rank 0, the client rank 1),
        on a thread of its own. Loop here to serve several operations."""

    @classmethod
    def new_session(
        cls, address: str, timeout: timedelta = DEFAULT_TIMEOUT, job_secret: str | None = None
    ) -> ProcessGroup:
        """Start a session at the server `address` and return this client's
        process group for it, configured as rank 1 of 2."""
        request = urllib.request.Request(address)
        secret = auth.resolve_job_secret(job_secret)
        if secret is not None:
            request.add_header(auth.HTTP_HEADER, secret)
        try:
            with urllib.request.urlopen(request, timeout=timeout.total_seconds()) as f:
                data = json.load(f)
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"parameter server at {address} refused a session: {e.code} {e.read().decode(errors='replace')}"
            ) from e
        session_id, store_addr = data["session_id"], data["store_addr"]
        logger.info("joining parameter server session %s at %s", session_id, store_addr)
        pg = cls.new_process_group()
        pg.configure(store_addr, replica_id="0", rank=1, world_size=2)
        return pg

    def _run_session(self, session_id: str, store_addr: str) -> None:
        pg = self.new_process_group()
        try:
            pg.configure(store_addr, replica_id="0", rank=0, world_size=2)
            self.forward(session_id, pg)
        except Exception:
            logger.exception("parameter server session %s failed", session_id)
        finally:
            pg.shutdown()
            self._slots.release()

    def _session_store_addr(self, session_id: str) -> str:
        return f"{_url_host(self._host)}:{self.store.port}/session/{session_id}"


class _SessionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        import socket

        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _handler(ps: ParameterServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("parameter server %s: " + format, self.address_string(), *args)

        def _refuse(self, code: int, text: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path != SESSION_PATH:
                self._refuse(400, f"invalid path {self.path!r}: sessions start at {SESSION_PATH}")
                return
            if ps._secret is not None and not auth.header_presents(
                self.headers.get(auth.HTTP_HEADER), ps._secret
            ):
                self._refuse(401, f"this server requires the job secret ({auth.SECRET_ENV})")
                return
            if not ps._slots.acquire(blocking=False):
                self._refuse(503, "too many sessions running; try again later")
                return
            session_id = str(uuid.uuid4())
            store_addr = ps._session_store_addr(session_id)
            body = (
                json.dumps({"session_id": session_id, "store_addr": store_addr}) + "\n"
            ).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
            except OSError:
                ps._slots.release()
                return
            logger.info("parameter server session %s at %s", session_id, store_addr)
            # This request's thread serves the session (the answer is already out).
            ps._run_session(session_id, store_addr)

    return Handler
