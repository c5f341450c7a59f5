"""HTTPTransport: serve a state dict over HTTP; receivers pull it, streamed and chunked.

The sender runs a threaded HTTP server on an ephemeral port (`http_server`),
reachable at ``address()`` == ``metadata()`` == ``http://host:port/checkpoint/``
(the step is appended by the receiver). A request waits up to the transport
timeout for serving to be allowed (`gate.ServingGate`). A request for a step
other than the one served is answered ``400`` with a body naming both steps
(the served one also in a header), and the receiver raises
`http_fetch.CheckpointHTTPError` (a `RecoveryError` and a
`urllib.error.HTTPError`) naming the peer, the step it serves and the step
requested. A chunk of a checkpoint that was re-sent since its metadata was
read is ``409``, a malformed path ``400``; a checkpoint not served within the
server's wait is ``503``, on which the receiver asks again until its own
timeout is spent and then raises `http_fetch.CheckpointTimeoutError` (a
`RecoveryError`, `TimeoutError` and `urllib.error.URLError`).

The receiver streams each piece straight into preallocated tensors (or into
its own tensors when `state_dict` is given) and checks every checksum; with
``num_chunks > 0`` it fetches that many chunks in parallel over separate
connections, with ``num_chunks=0`` one, and by default (None) as many as
`auto_chunks` picks for the payload's size once the metadata says it: one per
`AUTO_CHUNK_BYTES`, at most one per CPU this process may run on and at most
`AUTO_MAX_CHUNKS`. Parallel connections spread the receiver's work over its
cores, one receiving thread each: the kernel's copies, the checksums and, for
a receiver without a `state_dict`, the page faults of fresh memory. On the
2-core dev VM two connections beat one in 6 of 7 paired runs of a 400 MiB heal
(medians 0.23 vs 0.24 s into fresh tensors, 0.15 vs 0.16 s in place); a
connection and its threads cost 1-3 ms to set up there, so a small payload
keeps one. DTensors travel as their local shards plus their layout, and come
back as DTensors (see `serialization`).

`send_checkpoint` serves a state dict for a step; `disallow_checkpoint` stops
serving; `allow_checkpoint(step)` serves the last sent state dict again.

Serving never makes the sender wait for a receiver. What is served is a
snapshot taken by `send_checkpoint` (`serialization.pack(..., snapshot=True)`),
not the live state dict, so `disallow_checkpoint` closes serving to new
requests and returns at once, and the sender may run its optimizer step while
a slow receiver still streams the snapshot: that receiver gets exactly the
state of the step it asked for, or an error, never a mix of two steps. The
cost is memory: for CPU tensors the snapshot is a second copy of the state
(accelerator tensors needed a CPU copy to be served anyway, so nothing
changes for them), made once per send (a memcpy: 0.04 s for 64 MB, 0.28 s
for 512 MB on the 2-core dev VM, on the quorum thread). It is bounded to one
snapshot: after `disallow_checkpoint` the snapshot is freed when its
last transfer ends, and when the next checkpoint is served, transfers still
streaming the earlier one are cut off first (those receivers fail their heal
and retry at the next quorum), so it is freed before the new one is made. A
receiver stalled mid-transfer is also cut off by the socket timeout. (A healer
in the sender's quorum still holds up the sender's allreduces until it has
healed, as it joins them only then; that is the collective, not serving.)
Because the snapshot never changes, its checksums are computed once, on a
thread of their own started when it is served, not by every transfer
(`layout.PieceDigests`): a transfer only sends (0.03 s of CPU saved per
400 MiB sent on the dev VM), and the checksum also covers the snapshot's
memory between the copy and the send.

With TLS configured (``tls``, else ``TORCHFT_TLS_CERT``/``TORCHFT_TLS_KEY``/
``TORCHFT_TLS_CA``, see ``lighthouse.tls``) the server speaks HTTPS only, the
address is ``https://...``, and receives verify the sender's certificate
against the job's CA; a receiver and a sender that disagree on TLS fail with a
`ValueError` saying so. The advertised host must then be a name or address
the sender's certificate carries.

The advertised address is configurable: torchft advertised
`socket.gethostname()`, which resolved to the wrong network on multi-fabric
clusters. Pass `advertise_host` (the address of the NIC heals should use).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from typing import Generic, TypeVar

import torch

from lighthouse import auth, exposure
from lighthouse.tls import TlsConfig, resolve_tls, server_ssl_context
from torchft_pg.checkpointing.gate import ServingGate
from torchft_pg.checkpointing.http_fetch import CheckpointTimeoutError, ChunkFetcher
from torchft_pg.checkpointing.http_server import MAX_CHUNKS, CheckpointServer
from torchft_pg.checkpointing.named_healers import NamedHealers, healer_headers
from torchft_pg.checkpointing.serialization import (
    Packed,
    decode_skeleton,
    pack,
    prepare_receive,
    unpack,
)
from torchft_pg.checkpointing.transport import (
    CheckpointTransport,
    Deadline,
    SentCheckpoint,
    check_step,
    last_sent,
    log_transfer,
    logger,
    to_timedelta,
)
from torchft_pg.errors import RecoveryError

__all__ = [
    "AUTO_CHUNK_BYTES",
    "AUTO_MAX_CHUNKS",
    "MAX_CHUNKS",
    "HTTPTransport",
    "auto_chunks",
    "default_advertise_host",
]

T = TypeVar("T")
_WILDCARDS = ("", "0.0.0.0", "::")
#: With the default ``num_chunks``, one parallel chunk per this many payload bytes.
AUTO_CHUNK_BYTES = 128 << 20
#: With the default ``num_chunks``, at most this many parallel chunks.
AUTO_MAX_CHUNKS = 8


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what a container or taskset lets us use
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_chunks(payload_bytes: int, cpus: int | None = None) -> int:
    """How many parallel chunks a receive with the default ``num_chunks`` fetches.

    One per `AUTO_CHUNK_BYTES` of `payload_bytes` (a chunk's connection and
    threads cost 1-3 ms, a few MB of transfer), at most one per CPU
    (`cpus`, default: those this process may run on; more connections than
    cores only contend) and at most `AUTO_MAX_CHUNKS`; at least one.
    """
    cpus = _usable_cpus() if cpus is None else cpus
    return max(1, min(payload_bytes // AUTO_CHUNK_BYTES, cpus, AUTO_MAX_CHUNKS))


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


class HTTPTransport(CheckpointTransport[T], Generic[T]):
    """Serve and fetch checkpoints over HTTP (see module docstring).

    Constructed like torchft's: ``HTTPTransport(timeout, num_chunks)``, either
    positionally or by keyword; the other arguments are keyword extensions.

    Args:
        timeout: how long a request waits for serving to be allowed, and the
            socket timeout for a stalled receiver (a transfer whose receiver
            takes no bytes for this long is cut off); a `timedelta` or seconds
            (int or float).
        num_chunks: receive in this many parallel chunks/connections; 0 means one
            streamed request; None (the default) lets `auto_chunks` pick from the
            payload's size and this host's CPUs. At most `MAX_CHUNKS`.
        bind_host: address to listen on ("0.0.0.0" = every IPv4 interface; an
            IPv6 literal listens on IPv6). The port is ephemeral. Bind to the
            network heals should use. None: "0.0.0.0" with a job secret, else
            "127.0.0.1"; beyond loopback without a job secret: ``ValueError``
            unless ``insecure`` (``lighthouse.exposure``).
        advertise_host: the address put into `address()`/`metadata()`; None or
            "" means `default_advertise_host(bind_host)`. A loopback bind
            advertises only a loopback host (``ValueError`` otherwise).
        state_dict: optional callable returning the receiver's current state
            dict; matching tensors (same path, dtype, shape) are received in
            place, and so are DTensor local shards (see `serialization`).
        job_secret: the job's secret (default: ``$TORCHFT_JOB_SECRET`` or the
            file in ``$TORCHFT_JOB_SECRET_FILE``): every request must present
            it (401 otherwise) and every fetch sends it; None and no
            environment leave the server unchecked.
        tls: the job's TLS files (default: ``$TORCHFT_TLS_CERT``,
            ``$TORCHFT_TLS_KEY``, ``$TORCHFT_TLS_CA``, see ``lighthouse.tls``):
            the server speaks HTTPS with the certificate, and fetches verify
            the sender against the CA; none set: plain HTTP.
        insecure: listen beyond loopback without a job secret; None:
            ``$TORCHFT_INSECURE``. Default: refused.
    """

    def __init__(
        self,
        timeout: timedelta | float,
        num_chunks: int | None = None,
        bind_host: str | None = None,
        advertise_host: str | None = None,
        state_dict: Callable[[], T] | None = None,
        *,
        job_secret: str | None = None,
        tls: TlsConfig | None = None,
        insecure: bool | None = None,
    ) -> None:
        self._timeout_s = to_timedelta(timeout).total_seconds()
        # Required of every request and sent with every fetch (default: from the
        # environment, see lighthouse.auth); None leaves the server unchecked.
        self._job_secret = auth.resolve_job_secret(job_secret)
        insecure = exposure.insecure_opted_out(insecure)
        if bind_host is None:
            bind_host = exposure.default_host(
                self._job_secret, insecure, loopback=exposure.LOOPBACK_V4, wildcard="0.0.0.0"
            )
        if isinstance(bind_host, str):
            what = "the checkpoint HTTP server"
            exposure.check_bind(what, bind_host, bind_host, self._job_secret, insecure)
            if advertise_host:
                exposure.check_advertised(what, bind_host, advertise_host)
            auth.warn_if_exposed(logger, what, bind_host, self._job_secret)
        self._tls = tls if tls is not None else resolve_tls()
        if num_chunks is not None and type(num_chunks) is not int:
            raise TypeError(
                f"num_chunks must be an int or None, got {type(num_chunks).__name__} "
                f"{num_chunks!r:.100}"
            )
        if num_chunks is not None and not 0 <= num_chunks <= MAX_CHUNKS:
            raise ValueError(f"num_chunks must be in [0, {MAX_CHUNKS}], got {num_chunks}")
        if not isinstance(bind_host, str):
            raise TypeError(f"bind_host must be a str, got {type(bind_host).__name__}")
        if advertise_host is not None and not isinstance(advertise_host, str):
            raise TypeError(
                f"advertise_host must be a str or None, got {type(advertise_host).__name__}"
            )
        if state_dict is not None and not callable(state_dict):
            raise TypeError(
                f"state_dict must be a callable returning the state dict, got {type(state_dict).__name__}"
            )
        self._num_chunks = num_chunks
        self._state_dict = state_dict
        self._gate: ServingGate[Packed] = ServingGate()
        self._sent: SentCheckpoint[T] | None = None
        self._send_lock = threading.Lock()
        self._server = CheckpointServer(
            (bind_host, 0),
            self._gate,
            self._timeout_s,
            self._job_secret,
            None if self._tls is None else server_ssl_context(self._tls, "the checkpoint server"),
        )
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
        self._received_bytes: int | None = None  # of the last successful receive
        self._quorum: tuple[str, int] | None = None  # set_quorum: (quorum, replica rank)

    @property
    def port(self) -> int:
        return self._port

    def address(self) -> str:
        """The URL prefix this server serves checkpoints under: ``http://host:port/checkpoint/``
        (``https://`` with TLS).

        The host is the advertised one (`advertise_host`); an IPv6 host is in brackets.
        """
        host = f"[{self._host}]" if ":" in self._host else self._host
        scheme = "http" if self._tls is None else "https"
        return f"{scheme}://{host}:{self._port}/checkpoint/"

    def metadata(self) -> str:
        """What a receiver passes to `recv_checkpoint`: the same URL as `address()`."""
        return self.address()

    def set_quorum(self, quorum: str, replica_rank: int) -> None:
        """Serve later checkpoints only to the healers `quorum` names, and say in every
        receive that it comes from `replica_rank` of `quorum` (see `named_healers`)."""
        if not isinstance(quorum, str) or not quorum:
            raise ValueError(f"quorum must be a non-empty str 'epoch/quorum_id', got {quorum!r}")
        if type(replica_rank) is not int or replica_rank < 0:
            raise ValueError(f"replica_rank must be an int >= 0, got {replica_rank!r}")
        self._quorum = (quorum, replica_rank)

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        """Serve `state_dict` as `step` until `disallow_checkpoint`.

        Serves a snapshot (see the module docstring): returns once the state is
        copied to CPU memory of the transport's own, after which the caller may
        mutate `state_dict`. DTensors are served as their local shards and layouts.
        After `set_quorum` only the replica ranks `dst_ranks` of that quorum may
        fetch it; without, anyone who may reach the server (pull model: every
        receiver fetches for itself). `timeout` is unused. A transfer still
        streaming an earlier checkpoint is cut off.
        """
        del timeout
        check_step(step)
        with self._send_lock:
            self._sent = SentCheckpoint(step=step, state_dict=state_dict)
            self._server.healers = (
                None
                if self._quorum is None
                else NamedHealers(quorum=self._quorum[0], replica_ranks=frozenset(dst_ranks))
            )
            self._serve(step, state_dict)

    def allow_checkpoint(self, step: int) -> None:
        """Serve the state dict last sent (for `step`) again, e.g. after `disallow_checkpoint`.

        Nothing happens while it is still served for `step`. Otherwise a new
        snapshot is taken, so its values as they are now are served: re-allow
        only while the state dict still holds the state of `step`. `ValueError`
        naming `step` if the last `send_checkpoint` was for another step or
        there was none.
        """
        with self._send_lock:
            sent = last_sent(self._sent, step)
            if self._gate.serving_step != step:
                self._serve(step, sent.state_dict)

    def _serve(self, step: int, state_dict: T) -> None:
        # The earlier snapshot goes first (no new readers, its transfers cut off), so
        # it is freed before the new one is made, not held beside it.
        self._gate.disallow()
        cut = self._server.cut_streams(keep=None)
        start = time.perf_counter()
        packed = pack(state_dict, step, snapshot=True)
        self._gate.allow(step, packed)
        self._start_digests(packed)
        # A transfer that entered the earlier checkpoint just before the gate closed
        # may have registered after the cut above: it stops at its next piece, or here.
        cut += self._server.cut_streams(keep=packed)
        if cut:
            logger.warning(
                "checkpoint: cut off %d transfers of an earlier checkpoint to serve step %d",
                cut,
                step,
            )
        logger.info(
            "checkpoint serving step=%d bytes=%d snapshot_seconds=%.4f at %s",
            step,
            packed.nbytes,
            time.perf_counter() - start,
            self.metadata(),
        )

    def _start_digests(self, packed: Packed) -> None:
        """Checksum the snapshot's pieces on a thread of its own, so transfers only
        send (they compute a piece themselves if they get there first). The thread
        stops once the snapshot is no longer served or drained, so it holds the
        snapshot's memory no longer than the gate does (plus one piece)."""
        digests = packed.digests
        if digests is None:
            return
        gate = self._gate
        threading.Thread(
            target=digests.fill,
            args=(lambda: not gate.may_continue(packed),),
            name="ckpt-digest",
            daemon=True,
        ).start()

    def disallow_checkpoint(self) -> None:
        """Stop serving to new requests; returns at once, without waiting for any
        receiver: transfers in progress finish from the snapshot they stream."""
        self._gate.disallow()

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        """Fetch the state dict of `step` from the server at `metadata` within `timeout`.

        `metadata` is the sender's `metadata()` (its `address()`). Errors are
        `RecoveryError`s; a refusal by the peer (a wrong step, say) is also a
        `urllib.error.HTTPError` and running out of time also a `TimeoutError`
        and a `urllib.error.URLError` (see `http_fetch`). A zero `timeout`
        times out at once, without contacting the peer.
        """
        check_step(step)
        budget = to_timedelta(timeout, allow_zero=True)
        url = urllib.parse.urlsplit(metadata)
        scheme = "http" if self._tls is None else "https"
        if (
            url.scheme not in ("http", "https")
            or not url.hostname
            or not url.port
            or not url.path.endswith("/")
        ):
            raise ValueError(
                f"metadata must be '{scheme}://host:port/checkpoint/', got {metadata!r}"
            )
        if url.scheme != scheme:
            raise ValueError(
                f"the sender at {metadata!r} serves {url.scheme.upper()} but this receiver "
                + (
                    "has no TLS configuration (set TORCHFT_TLS_CA, or the job's certificate)"
                    if self._tls is None
                    else f"uses {self._tls.describe()}: every process of a job needs the same "
                    "TLS settings"
                )
            )
        peer = f"rank {src_rank} at {metadata}"
        if budget == timedelta(0):
            raise CheckpointTimeoutError(
                f"receiving step {step} from {peer}: timed out at once (timeout 0 s)"
            )
        deadline = Deadline(budget)
        fetch = ChunkFetcher(
            url.hostname,
            url.port,
            url.path,
            step,
            deadline,
            peer,
            self._job_secret,
            self._tls,
            None if self._quorum is None else healer_headers(*self._quorum),
        )
        meta = fetch.get_meta()
        skeleton = decode_skeleton(meta)
        if skeleton.step != step:
            raise RecoveryError(f"{fetch.peer} sent step {skeleton.step}, expected step {step}")
        template = self._state_dict() if self._state_dict is not None else None
        dests, direct, blobs = prepare_receive(skeleton, template, torch.device("cpu"))
        nbytes = sum(skeleton.blob_sizes)
        n = auto_chunks(nbytes) if self._num_chunks is None else max(1, self._num_chunks)
        fetch.get_chunks(skeleton, blobs, n)
        result = unpack(skeleton, blobs, dests)
        self._received_bytes = nbytes + len(meta)
        log_transfer(
            "received",
            fetch.peer,
            step,
            nbytes,
            deadline.elapsed(),
            f"chunks={n} tensors={len(skeleton.tensors)} in_place_blobs={len(direct)} checksum=ok",
        )
        return result  # type: ignore[no-any-return]

    def received_bytes(self) -> int | None:
        """Bytes the last successful `recv_checkpoint` fetched: every chunk's tensor
        data plus the skeleton (not HTTP headers or checksum trailers)."""
        return self._received_bytes

    def shutdown(self, wait: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._gate.shutdown()
        self._server.cut_streams(keep=None)
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join(timeout=self._timeout_s)
