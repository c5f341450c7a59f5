"""Run the lighthouse as one role of a scheduled job, and end it when training has ended.

A scheduler counts an application as finished when every role has exited, but the
lighthouse serves until it is told to stop. This wrapper runs ``python -m
lighthouse`` with the flags given after ``--`` and stops it (exit status 0) once
replica groups have joined and then none has been alive for ``--exit-when-idle-s``
seconds: the groups finished (or all died and none came back within that time).
A replica group the scheduler restarts rejoins well inside that window, so the
lighthouse, and the job's committed step it keeps, outlive single failures.

    python examples/launch/lighthouse_role.py --exit-when-idle-s 300 -- \\
        --bind [::]:29510 --http-bind [::]:29511 --job-secret-file /path/to/secret

Liveness is read from the lighthouse's own ``/status`` page (``live_count``), so
``--http-bind`` must not be ``none``. If ``--first-join-timeout-s`` passes before
any replica group joins, the lighthouse is stopped and the wrapper exits 3. A
SIGTERM/SIGINT is passed on to the lighthouse, which then shuts down as usual.
"""

from __future__ import annotations

import argparse
import enum
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from lighthouse.coordinator.cli import build_parser as lighthouse_parser

EXIT_NOBODY_CAME = 3
_STOP_GRACE_S = 30.0  # seconds the lighthouse gets to shut down after SIGTERM


class Verdict(enum.Enum):
    """What the wrapper does after one look at the lighthouse."""

    KEEP_SERVING = "keep serving"
    JOB_DONE = "job done"
    NOBODY_CAME = "nobody came"


@dataclass(frozen=True, kw_only=True)
class IdleRule:
    """When the lighthouse has served its job.

    exit_when_idle_s: seconds with no live replica group, once one has joined.
    first_join_timeout_s: seconds to wait for the first group; 0 waits forever.
    """

    exit_when_idle_s: float
    first_join_timeout_s: float

    def __post_init__(self) -> None:
        if self.exit_when_idle_s <= 0:
            raise ValueError(f"exit_when_idle_s must be > 0 seconds, got {self.exit_when_idle_s}")
        if self.first_join_timeout_s < 0:
            raise ValueError(
                f"first_join_timeout_s must be >= 0 seconds (0: forever), "
                f"got {self.first_join_timeout_s}"
            )


class IdleWatch:
    """Applies an IdleRule to successive ``live_count`` readings (pure: the caller
    passes the time, in seconds of a monotonic clock)."""

    def __init__(self, rule: IdleRule, started_s: float) -> None:
        self._rule = rule
        self._started_s = started_s
        self._joined = False
        self._idle_since_s: float | None = None

    def observe(self, *, now_s: float, live_count: int | None, quorums_issued: int = 0) -> Verdict:
        """``live_count`` None: the status page could not be read, which says nothing
        about the replicas, so it neither starts nor ends an idle stretch.
        ``quorums_issued`` > 0 also proves groups joined: a short job may join, train
        and leave between two looks, and must not leave the lighthouse waiting for
        a first join forever."""
        if live_count is not None and live_count > 0:
            self._joined = True
            self._idle_since_s = None
            return Verdict.KEEP_SERVING
        if quorums_issued > 0:
            self._joined = True
        if not self._joined:
            waited = now_s - self._started_s
            if self._rule.first_join_timeout_s and waited >= self._rule.first_join_timeout_s:
                return Verdict.NOBODY_CAME
            return Verdict.KEEP_SERVING
        if live_count is None:
            return Verdict.KEEP_SERVING
        if self._idle_since_s is None:
            self._idle_since_s = now_s
        if now_s - self._idle_since_s >= self._rule.exit_when_idle_s:
            return Verdict.JOB_DONE
        return Verdict.KEEP_SERVING


def status_url(http_bind: str) -> str:
    """The ``/status`` URL of a lighthouse whose ``--http-bind`` is ``http_bind``: a
    wildcard host is read over loopback."""
    if http_bind.lower() == "none":
        raise ValueError(
            "--http-bind none: this wrapper reads /status to see when the job has ended; "
            "give the lighthouse an HTTP address"
        )
    host, sep, port = http_bind.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--http-bind must be host:port, got {http_bind!r}")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "localhost"
    return f"http://{host}:{port}/status"


@dataclass(frozen=True, kw_only=True)
class StatusReading:
    """What one look at ``/status`` says: replicas live now (None: unreadable) and
    quorums issued so far."""

    live_count: int | None
    quorums_issued: int = 0


def read_status(url: str, timeout_s: float) -> StatusReading:
    """The lighthouse's ``live_count`` and ``quorums_issued``; an unreadable reading
    if ``url`` did not answer within ``timeout_s`` seconds with a status document."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            body = json.loads(reply.read())
    except (OSError, urllib.error.URLError, ValueError):
        return StatusReading(live_count=None)
    if not isinstance(body, dict):
        return StatusReading(live_count=None)
    count, issued = body.get("live_count"), body.get("quorums_issued")
    return StatusReading(
        live_count=count if isinstance(count, int) else None,
        quorums_issued=issued if isinstance(issued, int) else 0,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, sep, passed = _split_at_dashes(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exit-when-idle-s", type=float, default=300.0)
    parser.add_argument("--first-join-timeout-s", type=float, default=0.0)
    parser.add_argument("--poll-interval-s", type=float, default=1.0)
    args = parser.parse_args(own)
    if not sep:
        parser.error("give the lighthouse's flags after --")
    rule = IdleRule(
        exit_when_idle_s=args.exit_when_idle_s, first_join_timeout_s=args.first_join_timeout_s
    )
    url = status_url(lighthouse_parser().parse_args(passed).http_bind)

    child = subprocess.Popen([sys.executable, "-m", "lighthouse", *passed])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    watch = IdleWatch(rule, time.monotonic())
    verdict = Verdict.KEEP_SERVING
    while child.poll() is None and not stop.is_set():
        seen = read_status(url, timeout_s=min(2.0, args.poll_interval_s * 2))
        verdict = watch.observe(
            now_s=time.monotonic(), live_count=seen.live_count, quorums_issued=seen.quorums_issued
        )
        if verdict is not Verdict.KEEP_SERVING:
            break
        stop.wait(args.poll_interval_s)
    if child.poll() is not None:  # it ended on its own: its status is the role's
        return child.returncode
    why = "signalled" if verdict is Verdict.KEEP_SERVING else verdict.value
    print(f"lighthouse_role: {why}; stopping the lighthouse", flush=True)
    child.send_signal(signal.SIGTERM)
    try:
        rc = child.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        rc = child.wait()
    return EXIT_NOBODY_CAME if verdict is Verdict.NOBODY_CAME else rc


def _split_at_dashes(argv: list[str]) -> tuple[list[str], bool, list[str]]:
    if "--" not in argv:
        return argv, False, []
    i = argv.index("--")
    return argv[:i], True, argv[i + 1 :]


if __name__ == "__main__":
    sys.exit(main())
