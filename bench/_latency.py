"""Run a benchmark's replica groups in network namespaces, 25 ms from each other's hub.

`run_with_latency(groups, one_way_ms, lighthouse_argv, worker_argv)` builds a
`tests.chaos.netns.Network`: one namespace per replica group (hosts ``r0``,
``r1``, ... at 198.18.0.11, ...) and one for the lighthouses (host ``lh``,
198.18.0.1), each joined by a veth pair to a bridge in a hub namespace, with
addresses from 198.18.0.0/15 only. Every link delays each frame by
`one_way_ms` on its way out (``tc qdisc ... netem delay``, or, where the
kernel has no netem, the repository's userspace link emulator with the same
semantics), so two groups are ``2 * one_way_ms`` apart in round-trip time,
and every group is that far from the lighthouse too.

It starts ``lighthouse_argv`` in host ``lh``, reads one JSON line from it
(whatever the benchmark's lighthouse process prints once it listens), then
``worker_argv(i, host, that line)`` in each group's namespace, and returns
each worker's stdout. Every process is stopped by its own pid, and every
namespace and veth is deleted when it returns or fails (and at interpreter
exit otherwise; see `Network`). `unavailable()` says why namespaces cannot
be used here (not root, no ``ip``), for the benchmark to print.
"""

from __future__ import annotations

import contextlib
import selectors
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.chaos.netns import Network, available, die_with_parent  # noqa: E402

__all__ = ["LH_ADDR", "LatencyRun", "group_addr", "run_with_latency", "unavailable"]

LH_ADDR = "198.18.0.1"
_LH_START_S = 60.0  # the lighthouse process's start-up (imports, bind), at most
_WORKERS_S = 600.0  # every worker's whole run, at most


def group_addr(index: int) -> str:
    """Replica group `index`'s address."""
    return f"198.18.0.{11 + index}"


def unavailable() -> str | None:
    """None if the namespaces can be made here, else why not."""
    return available()


@dataclass(frozen=True, kw_only=True)
class LatencyRun:
    """What the workers printed, and how the links were slowed ("netem" or "linkemu")."""

    outputs: tuple[str, ...]
    impairment: str


def run_with_latency(
    groups: int,
    one_way_ms: float,
    lighthouse_argv: list[str],
    worker_argv: Callable[[int, str, str], list[str]],
    env: dict[str, str],
) -> LatencyRun:
    """See the module docstring."""
    hosts = {"lh": LH_ADDR, **{f"r{i}": group_addr(i) for i in range(groups)}}
    procs: list[subprocess.Popen[str]] = []
    with Network(hosts) as net:
        try:
            impairment = net.impair(delay_ms=one_way_ms, loss_pct=0.0)
            lighthouse = subprocess.Popen(
                net.exec_argv("lh", lighthouse_argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
                preexec_fn=die_with_parent,
            )
            procs.append(lighthouse)
            assert lighthouse.stdout is not None
            # Bounded: it prints its line once listening, or exits (EOF) on an error.
            line = _readline(lighthouse, _LH_START_S)
            if not line.startswith("{"):
                raise RuntimeError(f"the lighthouse process did not start: {line!r}")
            workers = [
                subprocess.Popen(
                    net.exec_argv(f"r{i}", worker_argv(i, group_addr(i), line.strip())),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                    preexec_fn=die_with_parent,
                )
                for i in range(groups)
            ]
            procs.extend(workers)
            outputs = tuple(w.communicate(timeout=_WORKERS_S)[0] for w in workers)
            return LatencyRun(outputs=outputs, impairment=impairment)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()  # by its own pid: `ip netns exec` execs the command
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
                for stream in (p.stdin, p.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The process's first stdout line, or '' if it printed none within `timeout_s` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=timeout_s):
            return ""
    return proc.stdout.readline()
