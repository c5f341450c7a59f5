"""The lighthouse's command line, ``python -m lighthouse`` / ``torchft-pg-lighthouse``:
run a lighthouse until SIGINT/SIGTERM.

Prints one line ``lighthouse listening on http://HOST:PORT (epoch E) status http://...``
once serving, then logs why each quorum is (not yet) formed.

Every flag is also accepted in torchft's underscore spelling (``--min_replicas``
for ``--min-replicas``), so torchft's launch commands work unchanged.
``torchft_main`` is torchft's own command, ``torchft_lighthouse`` (installed by
the torchft-pg-compat distribution): the same flags with torchft's defaults,
``--min_replicas`` required and a 60 s join timeout.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lighthouse import auth, exposure
from lighthouse._net import join_host_port
from lighthouse.connection_policy import (
    DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
    DEFAULT_UNAUTHENTICATED_TIMEOUT_S,
)
from lighthouse.coordinator.integrity import (
    DEFAULT_DIVERGENCE_WINDOW_S,
    DEFAULT_QUARANTINE_AFTER_DIVERGENCES,
)
from lighthouse.coordinator.quorum import (
    DEFAULT_HEARTBEAT_TIMEOUT_MS,
    DEFAULT_JOIN_TIMEOUT_MS,
    DEFAULT_MIN_REPLICAS,
    DEFAULT_QUARANTINE_AFTER_FAILURES,
    DEFAULT_QUARANTINE_BASE_MS,
    DEFAULT_QUORUM_TICK_MS,
)
from lighthouse.coordinator.server import DEFAULT_MAX_CONNECTIONS, LighthouseServer
from lighthouse.coordinator.state_lock import StateFileLock, StateFileLockedError
from lighthouse.coordinator.stragglers import (
    DEFAULT_STRAGGLER_SLOWDOWN,
    DEFAULT_STRAGGLER_WINDOW,
)
from lighthouse.tls import resolve_tls

DEFAULT_PORT = 29510
DEFAULT_HTTP_PORT = 29511
# torchft's command-line default join timeout (its Python LighthouseServer's is 100 ms).
TORCHFT_JOIN_TIMEOUT_MS = 60_000


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that also accepts each ``--a-b`` flag as ``--a_b`` (torchft's form)."""

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        aliases = [
            "--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]
        ]
        return super().add_argument(*names, *aliases, **kwargs)


def build_parser(
    prog: str = "torchft-pg-lighthouse",
    min_replicas: int | None = DEFAULT_MIN_REPLICAS,
    join_timeout_ms: int = DEFAULT_JOIN_TIMEOUT_MS,
) -> argparse.ArgumentParser:
    """The command line; `min_replicas` None makes ``--min-replicas`` required."""
    p = _Parser(
        prog=prog,
        description="The torchft_pg lighthouse: decides every quorum, detects dead replica groups.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--bind",
        default=None,
        help=f"gRPC listen address host:port; default: [::]:{DEFAULT_PORT} (every interface) "
        f"with a job secret, else 127.0.0.1:{DEFAULT_PORT} (this machine only). Beyond "
        "loopback without a job secret: refused unless --insecure",
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        default=min_replicas,
        required=min_replicas is None,
        help="fewest replica groups for a quorum (the fast path ignores it)",
    )
    p.add_argument(
        "--join-timeout-ms",
        type=int,
        default=join_timeout_ms,
        help="milliseconds to wait for live replicas that have not asked yet",
    )
    p.add_argument(
        "--quorum-tick-ms",
        type=int,
        default=DEFAULT_QUORUM_TICK_MS,
        help="milliseconds between background re-evaluations while a replica asks "
        "(while none does: at most every 500 ms, heartbeat timeout / 10, join timeout / 4)",
    )
    p.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=DEFAULT_HEARTBEAT_TIMEOUT_MS,
        help="milliseconds of silence before a replica is declared dead "
        "(a closed liveness stream declares it dead at once)",
    )
    p.add_argument(
        "--no-quorum-lease",
        action="store_true",
        help="grant no quorum leases: every step is a full quorum round",
    )
    p.add_argument(
        "--http-bind",
        default=None,
        help="dashboard, /status and /metrics host:port; 'none' to disable; default: "
        f"[::]:{DEFAULT_HTTP_PORT} with a job secret, else 127.0.0.1:{DEFAULT_HTTP_PORT}",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help=f"listen beyond loopback without a job secret (as ${exposure.INSECURE_ENV}=1 "
        "does): anyone who can reach the ports can join, read or stop the job",
    )
    p.add_argument(
        "--state-file",
        default="auto",
        help="JSON file keeping the job's committed step across lighthouse restarts, so a "
        "restarted lighthouse still refuses to restart the job below it; 'auto': "
        "lighthouse-<port>[-<job id>].state.json in $XDG_STATE_HOME/torchft-pg (default "
        "~/.local/state/torchft-pg); 'none': memory only",
    )
    p.add_argument(
        "--standby",
        action="store_true",
        help="wait for the lighthouse that holds this job's state file to exit, then take "
        "the job over from what it last wrote (same --state-file; give the managers both "
        "addresses, TORCHFT_LIGHTHOUSE=active:port,standby:port, or the same address on "
        "one host)",
    )
    p.add_argument(
        "--allow-step-reset",
        action="store_true",
        help="issue a quorum even below the job's committed step (restart a job from older "
        "state on purpose)",
    )
    p.add_argument(
        "--quarantine-after-failures",
        type=int,
        default=DEFAULT_QUARANTINE_AFTER_FAILURES,
        help="consecutive failed steps of a whole quorum after which its members that never "
        "committed (while others have) sit out for a while; 0 disables",
    )
    p.add_argument(
        "--quarantine-base-ms",
        type=int,
        default=DEFAULT_QUARANTINE_BASE_MS,
        help="first quarantine's length in milliseconds, doubled per repeat (at most 600 s)",
    )
    p.add_argument(
        "--quarantine-after-divergences",
        type=int,
        default=DEFAULT_QUARANTINE_AFTER_DIVERGENCES,
        help="times a replica may report its own state diverged from the majority's (silent "
        "data corruption, found by its integrity check) within --divergence-window-ms before "
        "it sits out for a while (never below --min-replicas); 0 disables",
    )
    p.add_argument(
        "--divergence-window-ms",
        type=int,
        default=round(DEFAULT_DIVERGENCE_WINDOW_S * 1000),
        help="the window in milliseconds over which --quarantine-after-divergences counts",
    )
    p.add_argument(
        "--straggler-window",
        type=int,
        default=DEFAULT_STRAGGLER_WINDOW,
        help="steps of each replica group's own work per step (its step time less its wait "
        "for the other groups) kept to tell a straggler; 0 disables straggler eviction",
    )
    p.add_argument(
        "--straggler-slowdown",
        type=float,
        default=DEFAULT_STRAGGLER_SLOWDOWN,
        help="a group whose median work per step over the window is at least this many times "
        "the other members' (> 1) is quarantined with the quarantine's backoff, never below "
        "--min-replicas; it is let back in after the backoff and judged on a new window",
    )
    p.add_argument(
        "--job-secret-file",
        default=None,
        help="file holding the job secret (at least 16 characters) every call must present; "
        "default: $TORCHFT_JOB_SECRET, else the file in $TORCHFT_JOB_SECRET_FILE, else no "
        "check (never pass the secret itself on the command line: ps shows it)",
    )
    p.add_argument(
        "--job-id",
        default=None,
        help="the job this lighthouse serves: replicas of another job (or of none) are "
        "refused, so two jobs never merge; default: $TORCHFT_JOB_ID, else no check",
    )
    p.add_argument(
        "--tls-cert",
        default=None,
        help="PEM certificate to serve gRPC over TLS with; it must name the host clients dial "
        "(subjectAltName); default: $TORCHFT_TLS_CERT, else plaintext",
    )
    p.add_argument(
        "--tls-key",
        default=None,
        help="PEM private key of --tls-cert; default: $TORCHFT_TLS_KEY",
    )
    p.add_argument(
        "--tls-ca",
        default=None,
        help="PEM CA bundle the job's clients verify servers with (the lighthouse only "
        "checks it is readable); default: $TORCHFT_TLS_CA, else the certificate itself",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="gRPC connections held at once, from all peers (more are closed on arrival); "
        f"default: {DEFAULT_MAX_CONNECTIONS}, or what the open-file limit carries if less",
    )
    p.add_argument(
        "--max-unauthenticated-per-peer",
        type=int,
        default=DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
        help="connections one address may hold that never authenticated (no call passed "
        "the job check); the oldest past it are closed",
    )
    p.add_argument(
        "--unauthenticated-timeout-ms",
        type=int,
        default=round(DEFAULT_UNAUTHENTICATED_TIMEOUT_S * 1000),
        help="milliseconds a connection may stay open without authenticating",
    )
    p.add_argument("--hostname", default=None, help="host name to advertise (default: bind host)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def default_binds(
    bind: str | None, http_bind: str | None, secret: str | None, insecure: bool
) -> tuple[str, str | None]:
    """The gRPC and status binds: the flags as given ('none' disables the status
    page), else port 29510 and 29511 on every interface with a job ``secret`` (or
    ``insecure``) and on 127.0.0.1 without (``lighthouse.exposure``)."""
    host = exposure.default_host(secret, insecure)
    grpc_bind = bind or join_host_port(host, DEFAULT_PORT)
    if http_bind is None:
        return grpc_bind, join_host_port(host, DEFAULT_HTTP_PORT)
    return grpc_bind, None if http_bind.lower() == "none" else http_bind


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``--state-file auto`` keeps the job state: the user's state
    directory (``$XDG_STATE_HOME``, else ``~/.local/state``) under ``torchft-pg``,
    never the working directory, so a state file never lands in a checkout."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "torchft-pg"


def state_file_for(
    arg: str, bind: str, job_id: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The ``--state-file`` path: None for 'none'; for 'auto', a file per port and
    job id in ``state_dir()`` (None if the port is 0: a fresh port each start);
    else ``arg`` itself. A job id keeps two jobs that use the same port apart."""
    if arg.lower() == "none":
        return None
    if arg.lower() != "auto":
        return arg
    port = bind.rsplit(":", 1)[-1]
    if port == "0":
        return None
    name = f"lighthouse-{port}"
    if job_id:
        name += "-" + re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:96]
    return str(state_dir(environ) / f"{name}.state.json")


def torchft_main(argv: list[str] | None = None) -> int:
    """``torchft_lighthouse``: torchft's command, with torchft's defaults."""
    return main(argv, build_parser("torchft_lighthouse", None, TORCHFT_JOIN_TIMEOUT_MS))


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        secret = None
        if args.job_secret_file:
            with open(args.job_secret_file, encoding="utf-8") as f:
                secret = f.read().strip()
        secret = auth.resolve_job_secret(secret)
        insecure = args.insecure or exposure.insecure_opted_out()
        bind, http_bind = default_binds(args.bind, args.http_bind, secret, insecure)
        state_file = state_file_for(args.state_file, bind, auth.resolve_job_id(args.job_id))
        state_lock = None
        if args.standby:
            if state_file is None:
                raise ValueError(
                    "--standby takes over a job from its state file: it needs one "
                    "(--state-file auto or a path), not --state-file none"
                )
            state_lock = StateFileLock(state_file)
            try:
                state_lock.acquire()
            except StateFileLockedError:
                print(
                    f"standby: waiting for the lighthouse that holds {state_file} "
                    f"({state_lock.holder() or 'holder unknown'}) to exit",
                    flush=True,
                )
                if not state_lock.wait(stop):
                    return 0
                print(f"standby: taking the job over from {state_file}", flush=True)
        server = LighthouseServer(
            bind=bind,
            min_replicas=args.min_replicas,
            join_timeout_ms=args.join_timeout_ms,
            quorum_tick_ms=args.quorum_tick_ms,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
            quorum_lease=not args.no_quorum_lease,
            http_bind=http_bind,
            hostname=args.hostname,
            state_file=state_file,
            allow_step_reset=args.allow_step_reset,
            quarantine_after_failures=args.quarantine_after_failures,
            quarantine_base_ms=args.quarantine_base_ms,
            job_secret=secret,
            job_id=args.job_id,
            tls=resolve_tls(args.tls_cert, args.tls_key, args.tls_ca),
            max_connections=args.max_connections,
            max_unauthenticated_per_peer=args.max_unauthenticated_per_peer,
            unauthenticated_timeout_ms=args.unauthenticated_timeout_ms,
            insecure=insecure,
            state_lock=state_lock,
            quarantine_after_divergences=args.quarantine_after_divergences,
            divergence_window_ms=args.divergence_window_ms,
            straggler_window=args.straggler_window,
            straggler_slowdown=args.straggler_slowdown,
        )
    except (ValueError, TypeError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(
        f"lighthouse listening on {server.address()} (epoch {server.epoch})"
        f" status {server.http_address() or 'disabled'}"
        f" job secret {'required' if server.requires_job_secret else 'not set: calls unchecked'}"
        f" {'TLS on' if server.tls is not None else 'TLS off'}",
        flush=True,
    )
    print(
        f"job state (the committed step) kept in {state_file} (--state-file)"
        if state_file
        else "job state (the committed step) kept in memory only (--state-file)",
        flush=True,
    )
    while not stop.wait(timeout=1.0):
        pass
    server.shutdown()
    return 0
