"""Manager-level quorum benchmark: ``start_quorum()`` + ``should_commit()`` per step.

N replica processes (one-rank groups, ``ProcessGroupDummy``, no collectives), a
lighthouse with ``min_replicas=N``, 300 steps, with quorum leases on and off.
This is a torchft user's loop that relies on the quorum as the step barrier:
nothing but the quorum keeps the replicas in step, so it checks that leased
rounds keep them aligned and that a replica finishing first strands nobody.

Per scenario: the median step time over all replicas, how many replicas
finished all steps, and the largest step lead any replica had over the slowest
(in steps started, from the replicas' step logs). The plain-torch reference is the same
N processes meeting at a TCPStore barrier each step (torch's own way to keep
processes in step), so ``ratio`` = our median / the barrier's median.

Prints a table and, last, one JSON line. Bounded: a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 300
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TORCHFT_N16_MEDIAN_MS = 12.4  # torchft's Manager on this machine type, leases do not exist there


def worker(lighthouse: str, index: int, barrier_port: int, world: int, mode: str) -> None:
    """One replica: STEPS steps, then one JSON line with its step times and finish time."""
    from torch.distributed import TCPStore

    times: list[float] = []
    stamps: list[float] = []
    if mode == "barrier":
        store = TCPStore("127.0.0.1", barrier_port, world, False, timedelta(seconds=60))
        for step in range(STEPS):
            stamps.append(time.time())
            t = time.perf_counter()
            if store.add(f"b{step}", 1) == world:  # the last to arrive opens the barrier
                store.set(f"go{step}", "1")
            store.wait([f"go{step}"])
            times.append(time.perf_counter() - t)
        print(json.dumps({"index": index, "times": times, "stamps": stamps, "ok": True}))
        return

    from torchft_pg import ProcessGroupDummy
    from torchft_pg.manager import Manager

    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupDummy(),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"r{index}",
        min_replica_size=1,
        quorum_timeout=timedelta(seconds=60),
        init_sync=False,
    )
    error = ""
    try:
        while manager.current_step() < STEPS:
            stamps.append(time.time())
            t = time.perf_counter()
            manager.start_quorum()
            manager.should_commit()
            times.append(time.perf_counter() - t)
    except Exception as exc:  # reported, not raised: the parent tabulates failures
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        manager.shutdown()
    print(
        json.dumps(
            {"index": index, "times": times, "stamps": stamps, "ok": not error, "error": error}
        )
    )


def max_lead(results: list[dict[str, object]]) -> int:
    """The largest number of steps any replica had started beyond the slowest one
    (from the wall-clock stamps taken as each step starts). The quorum as a step
    barrier keeps this at 1."""
    events = sorted(
        (stamp, r["index"])
        for r in results
        for stamp in r["stamps"]  # type: ignore[attr-defined]
    )
    done: dict[object, int] = {r["index"]: 0 for r in results}
    lead = 0
    for _, idx in events:
        done[idx] += 1
        lead = max(lead, max(done.values()) - min(done.values()))
    return lead


def run(n: int, mode: str) -> dict[str, float]:
    from torch.distributed import TCPStore

    from lighthouse import LighthouseServer

    lh = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=n,
        join_timeout_ms=10_000,
        quorum_lease=mode == "lease",
    )
    barrier = TCPStore("127.0.0.1", 0, n + 1, True, timedelta(seconds=60), wait_for_workers=False)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                lh.address(),
                str(i),
                str(barrier.port),
                str(n),
                mode,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ENV,
        )
        for i in range(n)
    ]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if lines:
                results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # by its own pid
                p.wait(timeout=10)
        lh.shutdown()
    times = [t for r in results for t in r["times"][5:]]  # skip warm-up steps
    finished = sum(1 for r in results if r["ok"] and len(r["times"]) >= STEPS)
    errors = sorted({r.get("error", "") for r in results if not r["ok"]})
    return {
        "median_ms": statistics.median(times) * 1000 if times else float("nan"),
        "p90_ms": statistics.quantiles(times, n=10)[-1] * 1000 if len(times) > 10 else float("nan"),
        "finished": finished,
        "max_lead": max_lead(results) if results else -1,
        "errors": errors[:2],  # type: ignore[dict-item]
    }


def main() -> int:
    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    t0 = time.monotonic()
    print(
        f"{'N':>3} {'mode':<9}{'median ms':>10}{'p90 ms':>9}{'finished':>10}"
        f"{'max lead':>9}{'ratio':>7}"
    )
    table: dict[str, dict[str, object]] = {}
    for n in (2, 4, 8, 16):
        base = run(n, "barrier")
        for mode in ("barrier", "lease", "no_lease"):
            r = base if mode == "barrier" else run(n, mode)
            ratio = r["median_ms"] / base["median_ms"] if base["median_ms"] else float("nan")
            table[f"n{n}_{mode}"] = {**r, "ratio": round(ratio, 2)}
            print(
                f"{n:>3} {mode:<9}{r['median_ms']:>10.2f}{r['p90_ms']:>9.2f}"
                f"{int(r['finished']):>7}/{n:<2}{int(r['max_lead']):>9}{ratio:>7.2f}"
            )
            for e in r["errors"]:  # type: ignore[attr-defined]
                print(f"      error: {e}")
    n16 = table["n16_lease"]
    print(
        json.dumps(
            {
                "bench": "manager_quorum",
                "steps": STEPS,
                "results": table,
                "torchft_n16_median_ms": TORCHFT_N16_MEDIAN_MS,
                "n16_lease_beats_torchft": n16["median_ms"] < TORCHFT_N16_MEDIAN_MS,  # type: ignore[operator]
                "wall_s": round(time.monotonic() - t0, 1),
                "cpus": os.cpu_count(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        lighthouse, index, port, world, mode = sys.argv[2:7]
        worker(lighthouse, int(index), int(port), int(world), mode)
        sys.exit(0)
    sys.exit(main())
