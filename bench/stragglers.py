"""The job's steps per second with a straggler: eviction off, eviction on, and the
healthy groups alone, in one run.

Replica groups (one process each: Manager + ProcessGroupGloo, a 20 ms simulated
step, as in `bench/lighthouse_outage.py`), one of them slowed (it sleeps
`--slow-factor` times as long per step). Three phases, each on a fresh
lighthouse (the CLI, with its status page) and fresh groups:

1. the healthy groups alone (the rate to match);
2. all groups with straggler eviction off (`--straggler-window 0`): the job
   runs at the slow group's pace;
3. all groups with eviction on (`--straggler-window`, default slowdown): once
   the window has filled and the slow group is quarantined, the job's rate.

Per phase: the job's steps per second (its highest committed step over the
phase's length), the ratio to the healthy groups' rate, and what each group
reported to the lighthouse (its step time and its own work per step, the
signal the detector uses: the medians of the /status samples taken).

    python bench/stragglers.py [--measure-s 10] [--slow-factor 2] [--window 50]

Prints a table and one JSON line. Every process is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lighthouse_restart import ROOT, _free_port, one_rank_group

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "torchft_pg"])
STEP_S = 0.02  # simulated compute per step of a healthy group (s)
MAX_STEPS = 1_000_000  # a bound on each replica's loop; the controller stops it long before


def _replica(index: int, step_s: float, lighthouse: str, conn: Connection, stop: Any) -> None:
    manager, grad, _store = one_rank_group(f"group{index}", lighthouse, timedelta(seconds=120))
    try:
        for _ in range(MAX_STEPS):
            if stop.is_set():
                break
            time.sleep(step_s)  # simulated compute, not synchronization
            try:
                manager.start_quorum()
                manager.allreduce(grad).wait()
                committed = manager.should_commit()
            except Exception as e:  # quarantined: its quorum waits, then may time out
                conn.send(("error", index, time.time(), f"{type(e).__name__}: {e}", 0))
                continue
            conn.send(("step", index, time.time(), committed, manager.current_step()))
    finally:
        manager.shutdown(wait=False)


class _Lighthouse:
    """The lighthouse CLI on free ports with ``flags``; ``status()`` reads /status."""

    def __init__(self, flags: list[str]) -> None:
        port, self.http_port = _free_port(), _free_port()
        self.address = f"127.0.0.1:{port}"
        self._dir = tempfile.mkdtemp(prefix="torchft-pg-bench-stragglers-")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lighthouse",
                "--bind",
                self.address,
                "--http-bind",
                f"127.0.0.1:{self.http_port}",
                "--state-file",
                os.path.join(self._dir, "lighthouse.state.json"),
                "--min-replicas",
                "2",
                "--join-timeout-ms",
                "2000",
                "--log-level",
                "WARNING",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("lighthouse listening on"):
            self.kill()
            raise RuntimeError(f"lighthouse did not start: {line!r}")

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/status"
        with urllib.request.urlopen(url, timeout=5) as r:
            return dict(json.loads(r.read()))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)


@dataclass
class GroupNumbers:
    """What one group reported over a phase (medians of the /status samples, ms)."""

    replica_id: str
    step_time_ms: float | None
    busy_ms: float | None


@dataclass
class Phase:
    name: str
    groups: int
    seconds: float
    steps_per_s: float
    ratio_to_healthy: float = 0.0
    evicted_after_s: float | None = None  # eviction on: from the first commit to the quarantine
    quarantine_reason: str | None = None
    reported: list[GroupNumbers] = field(default_factory=list)


@dataclass
class StragglerReport:
    step_ms: float
    slow_factor: float
    window: int
    phases: list[Phase] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _phase(
    name: str, step_times: list[float], flags: list[str], measure_s: float, evict: bool
) -> tuple[Phase, list[str]]:
    lh = _Lighthouse(flags)
    stop = _CTX.Event()
    conns: list[Connection] = []
    procs = []
    events: list[tuple[str, int, float, Any, int]] = []
    errors: list[str] = []

    def collect(until: float) -> None:
        while conns:
            left = until - time.time()
            if left <= 0:
                return
            ready = wait(conns, timeout=left)
            for c in conns[:]:
                if c not in ready:
                    continue
                try:
                    ev = c.recv()
                except EOFError:
                    conns.remove(c)
                    continue
                events.append(ev)

    def job_step(before: float) -> int:
        return max(
            (ev[4] for ev in events if ev[0] == "step" and ev[3] and ev[2] <= before), default=0
        )

    try:
        for i, step_s in enumerate(step_times):
            parent, child = _CTX.Pipe(duplex=False)
            p = _CTX.Process(
                target=_replica, args=(i, step_s, lh.address, child, stop), daemon=True
            )
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        deadline = time.time() + 120
        while time.time() < deadline:  # every group committed once
            collect(time.time() + 0.5)
            if len({ev[1] for ev in events if ev[0] == "step" and ev[3]}) == len(step_times):
                break
        else:
            raise RuntimeError(f"{name}: the groups did not all commit within 120 s")
        started = time.time()
        evicted_after = None
        reason = None
        if evict:  # wait for the window to fill and the straggler to be quarantined
            while time.time() < started + 120:
                collect(time.time() + 0.5)
                held = lh.status()["quarantined"]
                if held:
                    evicted_after = time.time() - started
                    reason = str(held[0]["reason"])
                    break
            else:
                raise RuntimeError(f"{name}: no straggler was quarantined within 120 s")
            collect(time.time() + 2.0)  # the others re-form their quorum
        else:
            collect(time.time() + 2.0)  # warm up
        t0 = time.time()
        samples: dict[str, list[tuple[float | None, float | None]]] = {}
        while time.time() < t0 + measure_s:
            collect(min(t0 + measure_s, time.time() + 1.0))
            for row in lh.status()["health"]:
                samples.setdefault(row["replica_id"], []).append(
                    (row["step_time_ms"], row.get("busy_ms"))
                )
        t1 = time.time()
        s0, s1 = job_step(t0), job_step(t1)
        reported = []
        for rid, rows in sorted(samples.items()):
            times = [t for t, _ in rows if t is not None]
            busy = [b for _, b in rows if b is not None]
            reported.append(
                GroupNumbers(
                    replica_id=rid,
                    step_time_ms=round(statistics.median(times), 1) if times else None,
                    busy_ms=round(statistics.median(busy), 1) if busy else None,
                )
            )
        errors.extend(f"{name}: group {ev[1]}: {ev[3]}" for ev in events if ev[0] == "error")
        phase = Phase(
            name=name,
            groups=len(step_times),
            seconds=round(t1 - t0, 2),
            steps_per_s=round((s1 - s0) / (t1 - t0), 2),
            evicted_after_s=None if evicted_after is None else round(evicted_after, 2),
            quarantine_reason=reason,
            reported=reported,
        )
        return phase, errors
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=10)
        lh.kill()


def run(
    measure_s: float = 10.0, slow_factor: float = 2.0, window: int = 50, healthy: int = 2
) -> StragglerReport:
    report = StragglerReport(step_ms=STEP_S * 1000, slow_factor=slow_factor, window=window)
    fast = [STEP_S] * healthy
    slow = [*fast, STEP_S * slow_factor]
    for name, times, flags, evict in (
        (f"{healthy} healthy alone", fast, ["--straggler-window", "0"], False),
        (f"{healthy}+1 slow, eviction off", slow, ["--straggler-window", "0"], False),
        (
            f"{healthy}+1 slow, eviction on",
            slow,
            ["--straggler-window", str(window)],
            True,
        ),
    ):
        phase, errors = _phase(name, times, flags, measure_s, evict)
        report.phases.append(phase)
        if name.endswith("eviction off"):
            errors = []  # nothing is quarantined there; nothing fails either
        report.errors.extend(e for e in errors if "quarantined" not in e)
    base = report.phases[0].steps_per_s
    for p in report.phases:
        p.ratio_to_healthy = round(p.steps_per_s / base, 3) if base else 0.0
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure-s", type=float, default=10.0)
    parser.add_argument("--slow-factor", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    report = run(args.measure_s, args.slow_factor, args.window)
    print(
        f"{STEP_S * 1000:.0f} ms steps, one group {args.slow_factor:g}x slower; "
        f"eviction: --straggler-window {args.window}, default slowdown"
    )
    print(f"{'phase':<28} {'s':>6} {'steps/s':>8} {'vs healthy':>11} {'evicted after (s)':>18}")
    for p in report.phases:
        evicted = "" if p.evicted_after_s is None else f"{p.evicted_after_s:.1f}"
        print(
            f"{p.name:<28} {p.seconds:>6.1f} {p.steps_per_s:>8.1f} "
            f"{p.ratio_to_healthy:>11.2f} {evicted:>18}"
        )
        for g in p.reported:
            print(
                f"    {g.replica_id:<10} reported step time {g.step_time_ms} ms, work {g.busy_ms} ms"
            )
        if p.quarantine_reason:
            print(f"    quarantined: {p.quarantine_reason}")
    for e in report.errors:
        print("error:", e)
    print(json.dumps({"bench": "stragglers", **asdict(report)}))


if __name__ == "__main__":
    main()
