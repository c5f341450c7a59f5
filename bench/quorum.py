"""Quorum benchmark: steady-state round latency and failure-detection latency.

1. N real client processes (N = 2, 8, 16, 32) looping over quorums, each on a
   persistent QuorumStream as manager servers do (``real_n*``) or through the
   blocking LighthouseClient's unary calls (``real_unary_n*``); a round's
   latency is the loop period (all N ask, all N are answered).
2. A simulated run: N = 8, 16, 128, 512, 1024 replicas in one asyncio process,
   each on its own persistent QuorumStream as manager servers do (``sim_n*``),
   and with one unary call per replica per round as LighthouseClient does
   (``sim_unary_n*``). Responses are counted; one per round is decoded.
3. Failure detection: 3 replica processes (ManagerServer + ManagerClient, 20 ms
   simulated steps); SIGKILL one; time until the survivors' next quorum.

Prints a table and, last, one JSON line. Bounded: well under 2 minutes.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lighthouse import LighthouseServer  # noqa: E402

TARGETS_MS = {
    "real_n8": 1.5,
    "real_n16": 3.0,
    "sim_n8": 1.5,
    "sim_n16": 3.0,
    "sim_n512": 100.0,
    "kill_to_quorum": 500.0,
}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lighthouse.testing", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
        cwd=ROOT,
    )


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=10)


def _cpu_s() -> float:
    """CPU seconds of this process (the lighthouse runs in it)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def real_clients(n: int, rounds: int, stream: bool) -> tuple[float, float]:
    """Per-round latency in ms with ``n`` client processes (``stream``: each on a
    persistent asyncio QuorumStream like a manager server; else LighthouseClient),
    and the clients' summed CPU ms per round in the timed loop."""
    lh = LighthouseServer(bind="127.0.0.1:0", min_replicas=n, join_timeout_ms=60_000)
    procs = [
        _spawn(
            [
                "client",
                "--lighthouse",
                lh.address(),
                "--replica-id",
                f"r{i:03d}",
                "--warmup",
                "20",
                "--rounds",
                str(rounds),
                *(["--stream"] if stream else []),
            ]
        )
        for i in range(n)
    ]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
        reports = [json.loads(o.strip().splitlines()[-1]) for o in outs]
        per_round = [r["elapsed_s"] / rounds for r in reports]
        return statistics.median(per_round) * 1000, sum(r["cpu_s"] for r in reports) / rounds * 1000
    finally:
        _stop(procs)
        lh.shutdown()


def simulated(n: int, rounds: int, stream: bool) -> float:
    """Median per-round latency in ms for ``n`` replicas simulated in one client process."""
    lh = LighthouseServer(bind="127.0.0.1:0", min_replicas=n, join_timeout_ms=60_000)
    procs = [
        _spawn(
            [
                "sim",
                "--lighthouse",
                lh.address(),
                "-n",
                str(n),
                "--rounds",
                str(rounds),
                *(["--stream"] if stream else []),
            ]
        )
    ]
    try:
        out = procs[0].communicate(timeout=90)[0]
        return float(json.loads(out.strip().splitlines()[-1])["median_round_s"]) * 1000
    finally:
        _stop(procs)
        lh.shutdown()


def kill_to_quorum() -> dict[str, float]:
    """SIGKILL one of 3 replica processes; ms until survivors' next quorum (defaults)."""
    lh = LighthouseServer(bind="127.0.0.1:0", min_replicas=2)
    procs = [
        _spawn(
            [
                "replica",
                "--lighthouse",
                lh.address(),
                "--replica-id",
                f"g{i}",
                "--rounds",
                "100000",
                "--step-ms",
                "20",
            ]
        )
        for i in range(3)
    ]
    try:
        for p in procs:  # wait for three-member quorums, bounded
            assert p.stdout is not None
            for _ in range(2000):
                ev = json.loads(p.stdout.readline() or "{}")
                if ev.get("event") == "quorum" and ev["size"] == 3:
                    break
        t_kill = time.monotonic()
        os.kill(procs[0].pid, signal.SIGKILL)
        lat = []
        for p in procs[1:]:
            assert p.stdout is not None
            for _ in range(2000):
                ev = json.loads(p.stdout.readline() or "{}")
                if ev.get("event") == "quorum" and ev["size"] == 2:
                    lat.append((ev["t"] - t_kill) * 1000)
                    break
        return {"max_ms": max(lat), "min_ms": min(lat)}
    finally:
        _stop(procs)
        lh.shutdown()


def main() -> int:
    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    t0 = time.monotonic()
    results: dict[str, float] = {}
    print(f"{'scenario':<34}{'ms/round':>10}{'target':>10}")
    cpu: dict[str, float] = {}
    for n, rounds in ((2, 400), (8, 200), (16, 150), (32, 80)):
        for stream, key in ((True, f"real_n{n}"), (False, f"real_unary_n{n}")):
            server0 = _cpu_s()
            results[key], cpu[f"{key}_clients"] = real_clients(n, rounds, stream=stream)
            cpu[f"{key}_server"] = (_cpu_s() - server0) / (rounds + 20) * 1000  # + warm-up rounds
    for n, rounds in ((8, 500), (16, 300)):
        results[f"sim_n{n}"] = simulated(n, rounds, stream=True)
    for n, rounds in ((128, 20), (512, 8), (1024, 5)):
        results[f"sim_n{n}"] = simulated(n, rounds, stream=True)
        results[f"sim_unary_n{n}"] = simulated(n, rounds, stream=False)
    kill = kill_to_quorum()
    results["kill_to_quorum"] = kill["max_ms"]
    for key, value in results.items():
        target = TARGETS_MS.get(key)
        print(f"{key:<34}{value:>10.2f}{'' if target is None else f'{target:>10.1f}'}")
    ok = {k: results[k] <= v for k, v in TARGETS_MS.items()}
    print("CPU ms per round: lighthouse process (incl. warm-up) / all clients (timed loop):")
    for key, value in cpu.items():
        print(f"  {key:<32}{value:>10.2f}")
    print(
        json.dumps(
            {
                "bench": "quorum",
                "ms": {k: round(v, 3) for k, v in results.items()},
                "cpu_ms_per_round": {k: round(v, 3) for k, v in cpu.items()},
                "targets_ms": TARGETS_MS,
                "meets_target": ok,
                "wall_s": round(time.monotonic() - t0, 1),
                "cpus": os.cpu_count(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
