"""Commits per second while the lighthouse is away, against the same time with it up.

Replica groups (one process each: Manager + ProcessGroupGloo, a 20 ms simulated
step, as in `bench/lighthouse_restart.py`) train while the lighthouse process
is, in turn: up (the baseline); frozen with SIGSTOP (sockets open, nothing
answers); up again; killed and kept down, then restarted on the same address
and state file; then killed once more with a standby (`--standby`, another
port, the same state file) waiting to take over. Membership does not change,
so a job that outlives its coordinator keeps committing through both outages.

Per phase: the job's commits per second (each group's committed steps, summed,
over the phase's length), and after each outage the quorum the groups commit
in by the end of the next phase (the current one): whether it is a new one (a
new quorum reconfigures every group; a restarted lighthouse has a new epoch,
so its first quorum is new), and the seconds from the lighthouse being back
to every group committing in it.

    python bench/lighthouse_outage.py [--outage-s 30] [--replicas 2]

Prints a table and one JSON line. Every process is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lighthouse_restart import ROOT, _free_port, _Lighthouse, one_rank_group

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "torchft_pg"])
STEP_S = 0.02  # simulated compute per step (s)
MAX_STEPS = 1_000_000  # a bound on each replica's loop; the controller stops it long before


def _replica(index: int, lighthouse: str, conn: Connection, stop: Any) -> None:
    # the lighthouse's address, then its standby's
    manager, grad, _store = one_rank_group(f"out{index}", lighthouse, timedelta(seconds=120))
    try:
        for _ in range(MAX_STEPS):
            if stop.is_set():
                break
            time.sleep(STEP_S)  # simulated compute, not synchronization
            manager.start_quorum()
            manager.allreduce(grad).wait()
            committed = manager.should_commit()
            conn.send(("step", index, time.time(), committed, manager.quorum_id()))
    except Exception as e:
        conn.send(("error", index, time.time(), f"{type(e).__name__}: {e}", None))
    finally:
        manager.shutdown()


@dataclass
class Phase:
    name: str
    seconds: float
    commits_per_s: float
    back_to_all_committing_s: float | None = None  # after an outage
    quorum_changed: bool | None = None  # after an outage: did the groups' quorum change


@dataclass
class OutageReport:
    replicas: int
    outage_s: float
    phases: list[Phase] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run(replicas: int = 2, outage_s: float = 30.0, up_s: float = 10.0) -> OutageReport:
    report = OutageReport(replicas=replicas, outage_s=outage_s)
    port, standby_port = _free_port(), _free_port()
    state_dir = tempfile.mkdtemp(prefix="torchft-pg-bench-outage-")
    state_file = os.path.join(state_dir, "lighthouse.state.json")
    lh = _Lighthouse(port, state_file)
    stop = _CTX.Event()
    conns: list[Connection] = []
    procs = []
    events: list[tuple[str, int, float, Any, Any]] = []
    standby: subprocess.Popen[str] | None = None

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
                if ev[0] == "error":
                    report.errors.append(f"replica {ev[1]}: {ev[3]}")

    def commits(t0: float, t1: float) -> int:
        return sum(1 for ev in events if ev[0] == "step" and ev[3] and t0 <= ev[2] < t1)

    def quorum_at(t: float, after: bool) -> set[Any]:
        seen: dict[int, Any] = {}
        for kind, index, at, ok, quorum in events:
            if kind == "step" and ok and ((at > t) if after else (at <= t)):
                if after and index in seen:
                    continue
                seen[index] = quorum
        return set(seen.values())

    def settled(phase_index: int, back: float, until: float, before: set[Any]) -> None:
        """After the outage ending at ``back``: the quorum each group last committed in
        by ``until`` (the current one), whether it differs from ``before``, and how
        long after ``back`` every group committed in it (None: not all did)."""
        last: dict[int, Any] = {}
        for kind, index, at, ok, quorum in events:
            if kind == "step" and ok and back < at <= until:
                last[index] = quorum
        first: dict[int, float] = {}
        for kind, index, at, ok, quorum in events:
            if kind == "step" and ok and back < at <= until and quorum == last.get(index):
                first.setdefault(index, at)
        p = report.phases[phase_index]
        p.quorum_changed = set(last.values()) != before
        p.back_to_all_committing_s = max(first.values()) - back if len(first) == replicas else None

    def all_committing_after(t: float, limit_s: float) -> float | None:
        deadline = time.time() + limit_s
        while True:
            first: dict[int, float] = {}
            for ev in events:
                if ev[0] == "step" and ev[3] and ev[2] > t and ev[1] not in first:
                    first[ev[1]] = ev[2]
            if len(first) == replicas:
                return max(first.values()) - t
            if time.time() >= deadline or report.errors:
                return None
            collect(min(deadline, time.time() + 0.5))

    def phase(name: str, seconds: float) -> tuple[float, float]:
        t0 = time.time()
        collect(t0 + seconds)
        t1 = time.time()
        report.phases.append(Phase(name, round(t1 - t0, 2), round(commits(t0, t1) / (t1 - t0), 1)))
        return t0, t1

    try:
        for i in range(replicas):
            parent, child = _CTX.Pipe(duplex=False)
            p = _CTX.Process(
                target=_replica,
                args=(i, f"127.0.0.1:{port},127.0.0.1:{standby_port}", child, stop),
                daemon=True,
            )
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        if all_committing_after(time.time(), 120) is None:
            raise RuntimeError(f"replica groups did not start committing: {report.errors}")
        phase("up", up_s)

        # Frozen: SIGSTOP, sockets open, nothing answers.
        before = quorum_at(time.time(), after=False)
        os.kill(lh.proc.pid, signal.SIGSTOP)
        phase("frozen (SIGSTOP)", outage_s)
        os.kill(lh.proc.pid, signal.SIGCONT)
        back = time.time()
        phase("up again", up_s)
        settled(-2, back, time.time(), before)

        # Down: killed, kept down, restarted on the same address and state file.
        before = quorum_at(time.time(), after=False)
        lh.kill()
        phase("down (killed)", outage_s)
        lh = _Lighthouse(port, state_file)
        back = lh.listening_at
        phase("up after restart", up_s)
        settled(-2, back, time.time(), before)

        # Killed with a standby waiting on the same state file.
        standby = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lighthouse",
                "--standby",
                "--bind",
                f"127.0.0.1:{standby_port}",
                "--http-bind",
                "none",
                "--state-file",
                state_file,
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert standby.stdout is not None
        waiting = standby.stdout.readline()  # it says it waits before the kill
        if not waiting.startswith("standby: waiting"):
            raise RuntimeError(f"the standby did not start: {waiting!r}")
        before = quorum_at(time.time(), after=False)
        killed = time.time()
        lh.kill()
        phase("standby takes over", up_s)
        settled(-1, killed, time.time(), before)
    finally:
        if standby is not None and standby.poll() is None:
            standby.kill()
            standby.wait(timeout=10)
        stop.set()
        for p in procs:
            p.join(timeout=15)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=10)
        if lh.proc.poll() is None:
            os.kill(lh.proc.pid, signal.SIGCONT)
        lh.kill()
        for name in os.listdir(state_dir):
            os.unlink(os.path.join(state_dir, name))
        os.rmdir(state_dir)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--up-s", type=float, default=10.0)
    args = parser.parse_args()
    report = run(args.replicas, args.outage_s, args.up_s)
    up = report.phases[0].commits_per_s if report.phases else 0.0
    print(
        f"{args.replicas} replica groups, {STEP_S * 1000:.0f} ms steps, outages of {args.outage_s:.0f} s"
    )
    print(
        f"{'phase':<20} {'s':>6} {'commits/s':>10} {'vs up':>7} {'back to all (s)':>16} {'new quorum':>11}"
    )
    for p in report.phases:
        ratio = p.commits_per_s / up if up else 0.0
        back = "" if p.back_to_all_committing_s is None else f"{p.back_to_all_committing_s:.2f}"
        changed = "" if p.quorum_changed is None else ("yes" if p.quorum_changed else "no")
        print(
            f"{p.name:<20} {p.seconds:>6.1f} {p.commits_per_s:>10.1f} {ratio:>7.2f} {back:>16} {changed:>11}"
        )
    for e in report.errors:
        print("error:", e)
    print(json.dumps({"bench": "lighthouse_outage", **asdict(report)}))


if __name__ == "__main__":
    main()
