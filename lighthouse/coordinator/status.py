"""The lighthouse's HTTP side: offline dashboard, ``/status`` JSON, ``/metrics``.

Served by a small threaded HTTP server; every request asks the event loop for a
fresh snapshot (bounded wait), so no state is shared across threads. The
dashboard's files and why they are drawn as they are: ``dashboard.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from lighthouse.accept_backoff import OUT_OF_DESCRIPTORS, AcceptBackoff
from lighthouse.coordinator import dashboard

log = logging.getLogger("lighthouse.http")

_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
# a healing member's quorum -> its report of the quorum's step (heal plus one step)
_CATCH_UP_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class LighthouseMetrics:
    """Prometheus metrics of one lighthouse, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.quorums = Counter("lighthouse_quorums", "Quorums issued (every round)", registry=r)
        self.new_ids = Counter(
            "lighthouse_quorum_id_changes", "Quorums issued with a new quorum id", registry=r
        )
        self.members = Gauge(
            "lighthouse_quorum_members", "Members of the latest quorum", registry=r
        )
        self.latency = Histogram(
            "lighthouse_quorum_latency_seconds",
            "From the first request of a round to its quorum, in seconds",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.deaths = Counter(
            "lighthouse_deaths_detected", "Replicas declared dead", ["cause"], registry=r
        )
        self.replica_step = Gauge(
            "lighthouse_replica_step",
            "Latest step of each live replica (sampled at most every 2 s)",
            ["replica_id"],
            registry=r,
        )
        self.replica_step_time = Gauge(
            "lighthouse_replica_step_time_seconds",
            "Each live replica's last reported step duration in seconds "
            "(absent until it reports one)",
            ["replica_id"],
            registry=r,
        )
        self.heals_counter = Counter(
            "lighthouse_heals",
            "Members that entered a quorum behind its highest step, so heal from a peer",
            registry=r,
        )
        self.heal_bytes = Counter(
            "lighthouse_heal_bytes",
            "Bytes received by the heals replicas reported (each heal counted once)",
            registry=r,
        )
        self.replica_heal_bytes = Gauge(
            "lighthouse_replica_heal_bytes",
            "Bytes each live replica's latest reported heal received (absent until it reports one)",
            ["replica_id"],
            registry=r,
        )
        self.replica_heal_seconds = Gauge(
            "lighthouse_replica_heal_seconds",
            "Transfer seconds of each live replica's latest reported heal "
            "(absent until it reports one)",
            ["replica_id"],
            registry=r,
        )
        self.catch_up = Histogram(
            "lighthouse_heal_catch_up_seconds",
            "From a healing member's quorum to its first report of the quorum's step, "
            "in seconds (the heal plus one step)",
            buckets=_CATCH_UP_BUCKETS_S,
            registry=r,
        )
        self.quarantines = Counter(
            "lighthouse_quarantines", "Quarantines imposed (every strike counts)", registry=r
        )
        self.integrity_divergences = Counter(
            "lighthouse_integrity_divergences",
            "Silent-data-corruption findings the replicas reported, by kind (diverged: its "
            "own state; heal_source_diverged: its heal source's; no_majority; "
            "gradient_diverged: its averaged gradient)",
            ["kind"],
            registry=r,
        )

    def quorum_issued(self, size: int, latency_s: float, new_id: bool) -> None:
        self.quorums.inc()
        if new_id:
            self.new_ids.inc()
        self.members.set(size)
        self.latency.observe(latency_s)

    def death(self, cause: str, count: int) -> None:
        label = "stream" if "stream" in cause else "heartbeat"
        self.deaths.labels(cause=label).inc(count)

    def replica_progress(self, replica_id: str, step: int, step_time_ms: float) -> None:
        self.replica_step.labels(replica_id=replica_id).set(step)
        if step_time_ms > 0:
            self.replica_step_time.labels(replica_id=replica_id).set(step_time_ms / 1000)

    def replica_gone(self, replica_id: str) -> None:
        """Drop a departed replica's series, so restarted incarnations do not pile up."""
        for gauge in (
            self.replica_step,
            self.replica_step_time,
            self.replica_heal_bytes,
            self.replica_heal_seconds,
        ):
            with contextlib.suppress(KeyError):  # it never reported progress
                gauge.remove(replica_id)

    def heals(self, count: int) -> None:
        self.heals_counter.inc(count)

    def caught_up(self, seconds: float) -> None:
        self.catch_up.observe(seconds)

    def heal_reported(self, replica_id: str, nbytes: int, seconds: float) -> None:
        """A replica reported a heal: ``nbytes`` received in ``seconds``."""
        self.heal_bytes.inc(nbytes)
        self.replica_heal_bytes.labels(replica_id=replica_id).set(nbytes)
        self.replica_heal_seconds.labels(replica_id=replica_id).set(seconds)

    def quarantined(self, count: int) -> None:
        self.quarantines.inc(count)

    def integrity_reported(self, kind: str) -> None:
        """A replica reported an integrity finding of ``kind`` (an ``IntegrityKind`` value)."""
        self.integrity_divergences.labels(kind=kind).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


READ_TIMEOUT_S = 10.0  # a status connection idle this long (s) is closed
MAX_CONNECTIONS = 64  # status connections served at once; more are closed on arrival
MAX_CONNECTIONS_PER_PEER = 16  # of them, from one address


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``max_connections`` at once, at
    most ``max_per_peer`` of them from one address, and whose accept loop backs
    off (``AcceptBackoff``) instead of spinning when the process runs out of
    file descriptors."""

    daemon_threads = True

    def __init__(
        self, addr: tuple[str, int], handler: Any, max_connections: int, max_per_peer: int
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max = max_connections
        self._max_per_peer = max_per_peer
        self._per_peer: dict[str, int] = {}
        self._peers_lock = threading.Lock()
        self._last_refusal_log = float("-inf")
        self._backoff = AcceptBackoff("status server")
        self.stopping = threading.Event()  # set by StatusHTTPServer.shutdown: ends a backoff
        super().__init__(addr, handler)

    def get_request(self) -> tuple[Any, Any]:
        try:
            conn: tuple[Any, Any] = super().get_request()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                delay, line = self._backoff.failed(exc, time.monotonic())
                if line is not None:
                    log.warning("%s", line)
                self.stopping.wait(delay)
            raise  # socketserver drops this accept and polls again
        line = self._backoff.accepted(time.monotonic())
        if line is not None:
            log.info("%s", line)
        return conn

    def _refuse(self, request: Any, why: str) -> None:
        now = time.monotonic()
        if now - self._last_refusal_log >= 10.0:
            self._last_refusal_log = now
            log.warning("status server: %s; closing new ones until some end", why)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0])
        with self._peers_lock:
            held = self._per_peer.get(peer, 0)
            if held >= self._max_per_peer:
                refused = f"{held} connections open from {peer} (the cap per address)"
            elif not self._slots.acquire(blocking=False):
                refused = f"{self._max} connections open (the cap; the latest from {peer})"
            else:
                refused = ""
                self._per_peer[peer] = held + 1
        if refused:
            self._refuse(request, refused)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def _release(self, peer: str) -> None:
        with self._peers_lock:
            left = self._per_peer[peer] - 1
            if left:
                self._per_peer[peer] = left
            else:
                del self._per_peer[peer]
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))


class StatusHTTPServer:
    """Serves ``/`` (dashboard), ``/status`` (JSON) and ``/metrics`` on ``bind``."""

    def __init__(
        self,
        bind: tuple[str, int],
        snapshot: Callable[[], dict[str, Any]],
        metrics: LighthouseMetrics,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        max_per_peer: int = MAX_CONNECTIONS_PER_PEER,
    ) -> None:
        """``snapshot`` returns the status dict (it may block up to a few seconds).

        A connection that sends nothing for ``read_timeout_s`` seconds is closed,
        and at most ``max_connections`` are served at once, at most
        ``max_per_peer`` from one address: more are closed on arrival (one log
        line per 10 s says so), so slow or idle clients cannot hold every
        thread and file descriptor and stop ``/status`` answering. When the
        process is out of file descriptors, accepting backs off (50 ms doubling
        to 1 s) and logs once per episode instead of spinning.
        """
        page = dashboard.dashboard_page()

        class Handler(BaseHTTPRequestHandler):
            timeout = read_timeout_s  # socket timeout for every read and write

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http: " + format, *args)

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path in dashboard.PATHS:
                        self._send(200, dashboard.CONTENT_TYPE, page)
                    elif path == "/status":
                        # compact: the step history is thousands of numbers
                        body = json.dumps(snapshot(), separators=(",", ":")).encode()
                        self._send(200, "application/json", body)
                    elif path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, metrics.render())
                    else:
                        self._send(404, "text/plain", f"no such page {path!r}\n".encode())
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    log.debug("http: %s went away before its answer", self.client_address[0])
                except Exception as exc:  # the page must not take the server down
                    log.exception("status page failed")
                    self._send(500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode())

        host, port = bind
        server_cls: type[_BoundedHTTPServer] = _BoundedHTTPServer
        if ":" in host:

            class V6Server(_BoundedHTTPServer):
                address_family = socket.AF_INET6

            server_cls = V6Server
        self._httpd = server_cls((host, port), Handler, max_connections, max_per_peer)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="lighthouse-http",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def shutdown(self) -> None:
        """Stop serving (waits at most ~2 s for the serving thread)."""
        self._httpd.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=2.0)
