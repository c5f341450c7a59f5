"""Recovery and overhead: what a failure costs, and what fault tolerance costs per step.

1. Lighthouse + 3 replica groups (small MLP), K SIGKILLs: time from a kill to
   the survivors' next commit, and from the restart to the restarted replica
   healed and committing, split into the Manager constructor, the replica's
   own compute, its wait for the survivors to end their step, reconfiguring,
   healing and the rest. The library's share is all of it but the compute and
   the wait (a step boundary no library can move).
2. The same with Baby groups (`ProcessGroupBabyGloo`: Gloo in a child
   process): kill -> survivors' next commit, as a ratio to the Gloo run of 1.,
   and a Baby child's start-up as a ratio to a plain ``python -c "import torch"``.
3. The lighthouse process SIGKILLed and restarted on the same address while 3
   replica groups train (`bench/lighthouse_restart.py`): from the new
   lighthouse listening to every group committing again, after a quick restart
   and after one that stays down 2 s. Plain torch has no lighthouse: no ratio.
4. Per-step cost of the Manager vs plain torch DDP over Gloo, 2 processes,
   same model and data, in short alternating rounds (4 steps each): the
   median of every round's ratio to its neighbouring plain round, both ranks.
5. The full `start_quorum` round (quorum RPC through each group's manager
   server and the lighthouse, leases off) with N = 2, 8, 16 one-rank replica
   groups, and at N = 16 the round answered from a quorum lease (the default).
Prints a table and, last, one JSON line; `--cases` runs a subset.

    .venv/bin/python bench/recovery.py [--quick] [--cases gloo,baby,lighthouse,overhead,quorum]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import lighthouse_restart
from bench.ddp_pairs import alternate, ddp_pair, paired_overhead
from tests.chaos_support import ChaosConfig, ChaosReport, run_chaos
from tests.multiproc import RankContext, run_ranks
from torchft_pg.chaos import FaultPlan

HIDDEN = 1024
CASES = ("gloo", "baby", "lighthouse", "overhead", "quorum")
TARGET_KILL_S = 0.5  # kill -> survivors' next commit
TARGET_LH_RESTART_S = 2.0  # lighthouse listening again -> every group committing


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )


def _step_times(ctx: RankContext) -> dict[str, list[float]]:
    """Alternate rounds of plain DDP and Manager DDP on the same 2 processes."""
    import torch

    lighthouse, rounds, steps = ctx.args
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(ctx.rank))
    pair = ddp_pair(ctx, lighthouse, _model, x, x.sum(dim=1, keepdim=True))
    out = alternate(ctx, pair, rounds, steps)
    pair.close()
    return out


def _quorum_rounds(ctx: RankContext) -> list[float]:
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupDummy
    from torchft_pg.manager import Manager

    lighthouse, rounds = ctx.args
    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupDummy(),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"q{ctx.rank}",
        init_sync=False,
    )
    times = []
    for r in range(rounds + 3):
        ctx.barrier(f"q/{r}")
        start = time.perf_counter()
        manager.start_quorum()
        manager.wait_quorum()
        times.append(time.perf_counter() - start)
        manager.should_commit()
    manager.shutdown()
    return times[3:]  # the first rounds form the quorum and configure


def _kills(pg_kind: str, kills: int, steps: int) -> ChaosReport:
    """3 replica groups, `kills` SIGKILLs of a whole group (each restarted), over `steps`.

    min_replicas 2 (a majority of 3): the first quorum never starts with one group
    alone while the others still start (a Baby child imports torch for seconds),
    so no kill can take the only group holding the committed steps.
    """
    plan = FaultPlan.random(
        seed=11, replicas=3, steps=steps, kills=kills, first_step=4, gap=12, same_replica_gap=24
    )
    report = run_chaos(
        ChaosConfig(
            replicas=3,
            steps=steps,
            plan=plan,
            pg_kind=pg_kind,
            min_replicas=2,
            verbose=False,
            deadline_s=900,
        ),
        out=lambda _: None,
    )
    if not report.ok:
        raise SystemExit(f"{pg_kind} recovery run failed: " + "; ".join(report.failures))
    return report


def _child_start(rounds: int) -> tuple[list[float], list[float], list[float]]:
    """Seconds to a Baby group's first child serving, to a replacement for a killed
    child serving (what an abort with an op in flight costs the next configure), and
    to a plain `python -c "import torch"`, alternating."""
    import os
    import signal

    from torchft_pg import ProcessGroupBabyGloo

    first, replacement, plain = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=60))
        pg.wait_started(timedelta(seconds=120))
        first.append(time.perf_counter() - start)
        child = pg._child
        assert child is not None
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait(timeout=30)
        start = time.perf_counter()
        pg.wait_started(timedelta(seconds=120))
        replacement.append(time.perf_counter() - start)
        pg.shutdown()
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        plain.append(time.perf_counter() - start)
    return first, replacement, plain


def main() -> None:
    # Every process of this benchmark runs on this machine: the Managers' servers
    # listen on loopback only, and so do not warn of an exposed job at each start.
    os.environ.setdefault("TORCHFT_BIND_HOST", "127.0.0.1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if not cases <= set(CASES):
        raise SystemExit(f"--cases: unknown {sorted(cases - set(CASES))}; known: {CASES}")
    result: dict[str, Any] = {"bench": "recovery"}
    targets: dict[str, bool] = {}
    gloo_kill_s: float | None = None
    restarts: _Restarts | None = None
    if "gloo" in cases:
        gloo_kill_s, restarts = _gloo_recovery(args.quick, result, targets)
    if "baby" in cases:
        _baby_recovery(args.quick, gloo_kill_s, result, targets)
    if "lighthouse" in cases:
        _lighthouse_recovery(args.quick, result, targets)
    if "overhead" in cases:
        _overhead(args.quick, result, targets)
    if "quorum" in cases:
        _quorum(args.quick, result, targets)
    if restarts is not None and "quorum" in cases:
        _library_share(restarts, result, targets)
    result["targets"] = targets
    print()
    print(json.dumps(result))


@dataclass(frozen=True)
class _Restarts:
    """What the Gloo run measured of its restarts (seconds), for the library's share."""

    library_start_s: list[float]
    after_wait_s: list[float]
    manager_start_s: float
    ready_commit_s: float


def _gloo_recovery(
    quick: bool, result: dict[str, Any], targets: dict[str, bool]
) -> tuple[float, _Restarts]:
    kills = 3 if quick else 8
    report = _kills("gloo", kills, 40 + 12 * kills)
    med = statistics.median
    kill_s = med(report.kill_to_survivor_commit_s)
    restart_s = med(report.restart_to_commit_s)
    manager_start_s = med(report.library_start_s)
    ready_commit_s = med(report.ready_to_commit_s)
    wait_s = med(report.join_quorum_s)
    configure_s = med(report.join_configure_s)
    heal_s = med(report.join_heal_s)
    step_time = ChaosConfig().step_time_s
    # Per restart: what is left of ready -> first commit once its own simulated
    # compute and its wait for the survivors' step boundary are taken out.
    after_wait = [
        max(0.0, r - q - step_time)
        for r, q in zip(report.ready_to_commit_s, report.join_quorum_s, strict=False)
    ]
    other = [
        max(0.0, a - c - h)
        for a, c, h in zip(after_wait, report.join_configure_s, report.join_heal_s, strict=False)
    ]
    print(
        f"\nrecovery: 3 replica groups, {report.kills} SIGKILLs, lighthouse defaults but join timeout "
        f"{ChaosConfig().join_timeout_ms} ms and min_replicas 2 (median)"
    )
    print(
        f"  kill -> survivors' next commit            {kill_s * 1e3:8.1f} ms   (torchft: 5100 ms at its CLI defaults)"
    )
    print(f"  restart -> healed and committing          {restart_s * 1e3:8.1f} ms")
    print(f"    Manager constructor                     {manager_start_s * 1e3:8.1f} ms")
    print(f"    ready -> first commit                   {ready_commit_s * 1e3:8.1f} ms, of which")
    print(f"      its own step compute (simulated)      {step_time * 1e3:8.1f} ms")
    print(f"      waiting for the survivors' step end   {wait_s * 1e3:8.1f} ms")
    print(f"      reconfiguring the process group       {configure_s * 1e3:8.1f} ms")
    print(f"      healing (HTTP transport)              {heal_s * 1e3:8.1f} ms")
    print(f"      the rest (connect tail, allreduce, vote) {med(other) * 1e3:5.1f} ms")
    print("  bit-identical replicas at the end          yes")
    result.update(
        kills=report.kills,
        kill_to_survivor_commit_ms=kill_s * 1e3,
        restart_to_commit_ms=restart_s * 1e3,
        manager_start_ms=manager_start_s * 1e3,
        join_wait_for_survivors_ms=wait_s * 1e3,
        join_configure_ms=configure_s * 1e3,
        join_heal_ms=heal_s * 1e3,
    )
    targets["kill_to_commit_le_500ms"] = kill_s <= TARGET_KILL_S
    return kill_s, _Restarts(report.library_start_s, after_wait, manager_start_s, ready_commit_s)


def _baby_recovery(
    quick: bool, gloo_kill_s: float | None, result: dict[str, Any], targets: dict[str, bool]
) -> None:
    med = statistics.median
    kills = 2 if quick else 4
    # A restarted Baby group's child imports torch (seconds) before it rejoins; the
    # survivors run on meanwhile, so the run needs room for that many steps per kill.
    report = _kills("baby", kills, 40 + 400 * kills)
    kill_s = med(report.kill_to_survivor_commit_s)
    worst_s = max(report.kill_to_survivor_commit_s)
    restart_s = med(report.restart_to_commit_s)
    baby_start, replacement, plain_start = _child_start(2 if quick else 4)
    ratio = None if gloo_kill_s is None else kill_s / gloo_kill_s
    print(f"\nrecovery with Baby groups (ProcessGroupBabyGloo), {report.kills} SIGKILLs (median)")
    print(
        f"  kill -> survivors' next commit            {kill_s * 1e3:8.1f} ms   "
        f"(worst {worst_s * 1e3:.1f} ms; target <= {TARGET_KILL_S * 1e3:.0f} ms"
        + ("" if ratio is None else f"; {ratio:.2f}x the Gloo run")
        + ")"
    )
    print(f"  restart -> healed and committing          {restart_s * 1e3:8.1f} ms")
    print(
        f"  Baby group start-up (first child serving) {med(baby_start) * 1e3:8.1f} ms   "
        f"(plain `python -c 'import torch'`: {med(plain_start) * 1e3:.1f} ms, "
        f"{med(baby_start) / med(plain_start):.2f}x)"
    )
    print(
        f"  a killed child's replacement serving      {med(replacement) * 1e3:8.1f} ms   "
        f"({med(replacement) / med(plain_start):.3f}x the plain import)"
    )
    result["baby"] = {
        "kills": report.kills,
        "kill_to_survivor_commit_ms": kill_s * 1e3,
        "kill_to_survivor_commit_worst_ms": worst_s * 1e3,
        "kill_to_survivor_commit_vs_gloo": ratio,
        "restart_to_commit_ms": restart_s * 1e3,
        "child_start_ms": med(baby_start) * 1e3,
        "plain_torch_import_ms": med(plain_start) * 1e3,
        "child_start_vs_plain_import": med(baby_start) / med(plain_start),
        "replacement_child_ms": med(replacement) * 1e3,
        "replacement_vs_plain_import": med(replacement) / med(plain_start),
    }
    targets["baby_kill_to_commit_le_500ms"] = kill_s <= TARGET_KILL_S


def _lighthouse_recovery(quick: bool, result: dict[str, Any], targets: dict[str, bool]) -> None:
    med = statistics.median
    rep = lighthouse_restart.run(replicas=3, restarts=4 if quick else 10)
    if rep.errors:
        raise SystemExit("lighthouse restart run failed: " + "; ".join(rep.errors))
    listen = rep.listen_to_all_committing_s
    quick_ones = listen[0::2]  # restarted at once (a process start: ~0.5 s down)
    slow_ones = listen[1::2]  # kept down 2 s more: the link retries at its slower pace
    print(
        f"\nlighthouse SIGKILLed and restarted on the same address, 3 replica groups, "
        f"{len(listen)} restarts (lighthouse CLI defaults)"
    )
    print(
        f"  listening again -> every group committing {med(listen) * 1e3:8.1f} ms median, "
        f"{max(listen) * 1e3:.1f} ms worst   (target <= {TARGET_LH_RESTART_S * 1e3:.0f} ms)"
    )
    print(
        f"    after a quick restart (down {med(rep.down_s[0::2]) * 1e3:.0f} ms)     "
        f"{med(quick_ones) * 1e3:8.1f} ms median"
    )
    if slow_ones:
        print(
            f"    after 2 s more down (down {med(rep.down_s[1::2]) * 1e3:.0f} ms)      "
            f"{med(slow_ones) * 1e3:8.1f} ms median"
        )
    print(
        f"  listening again -> first group committing {med(rep.listen_to_first_commit_s) * 1e3:8.1f} ms median"
    )
    result["lighthouse_restart"] = {
        "restarts": len(listen),
        "listen_to_all_committing_ms": med(listen) * 1e3,
        "listen_to_all_committing_worst_ms": max(listen) * 1e3,
        "after_quick_restart_ms": med(quick_ones) * 1e3,
        "after_2s_down_ms": med(slow_ones) * 1e3 if slow_ones else None,
        "listen_to_first_commit_ms": med(rep.listen_to_first_commit_s) * 1e3,
    }
    targets["lighthouse_restart_le_2s"] = max(listen) <= TARGET_LH_RESTART_S


def _overhead(quick: bool, result: dict[str, Any], targets: dict[str, bool]) -> None:
    from lighthouse import LighthouseServer

    med = statistics.median
    lh = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000)
    try:
        rounds, steps = (8, 4) if quick else (48, 4)
        per_rank = run_ranks(_step_times, 2, lh.address(), rounds, steps, timeout=600)
        r0 = per_rank[0]
        plain = med(r0["plain"])
        managed = med(r0["manager"])
        # the median of each round's paired ratio, over both ranks: adjacent
        # rounds share the machine's mood, which moves by more than the overhead
        # between minutes (and, on this VM, between runs: short rounds, many pairs)
        overhead = paired_overhead(per_rank, "manager", "plain")
        # the same for CPU per step (all of a rank's threads): less moved by the
        # machine's load than wall time, and it counts the work of our background
        # threads (the manager server's loop) that wall time may hide on idle cores
        cpu_overhead = paired_overhead(per_rank, "manager_cpu", "plain_cpu")
        cpu_plain, cpu_managed = med(r0["plain_cpu"]), med(r0["manager_cpu"])
        print(
            f"\nper-step time, 2 processes, MLP {HIDDEN} hidden ({rounds} alternating rounds x "
            f"{steps} steps, median; quorum leases on, the default)"
        )
        print(f"  plain torch DDP (Gloo)    {plain * 1e3:8.2f} ms   CPU {cpu_plain * 1e3:6.2f} ms")
        print(
            f"  torchft_pg Manager + DDP  {managed * 1e3:8.2f} ms   CPU {cpu_managed * 1e3:6.2f} ms"
            f"   overhead {overhead * 100:+.1f}% (median of paired rounds, both ranks)"
        )
        print(
            f"  CPU per step, paired the same way                   overhead {cpu_overhead * 100:+.1f}%"
        )
    finally:
        lh.shutdown()
    result.update(
        plain_ddp_step_ms=plain * 1e3,
        manager_step_ms=managed * 1e3,
        step_overhead_ratio=managed / plain,
        step_overhead_paired=overhead,
        step_cpu_overhead_paired=cpu_overhead,
    )
    targets["step_overhead_le_5pct"] = overhead <= 0.05


def _quorum(quick: bool, result: dict[str, Any], targets: dict[str, bool]) -> None:
    from lighthouse import LighthouseServer

    med = statistics.median
    quorum_ms: dict[str, float] = {}
    print(
        "\nstart_quorum round (one-rank replica groups, steady state, median over ranks' medians)"
    )
    sizes = (2, 8) if quick else (2, 8, 16)
    for n, lease in [(n, False) for n in sizes] + [(sizes[-1], True)]:
        lh = LighthouseServer(
            bind="127.0.0.1:0", min_replicas=n, join_timeout_ms=5000, quorum_lease=lease
        )
        try:
            per = run_ranks(_quorum_rounds, n, lh.address(), 30 if quick else 100, timeout=600)
        finally:
            lh.shutdown()
        key = f"n{n}_leased" if lease else f"n{n}"
        quorum_ms[key] = med(med(r) for r in per) * 1e3
        what = "answered from the quorum lease" if lease else "full round through the lighthouse"
        print(f"  N={n:2d}  {quorum_ms[key]:7.2f} ms   {what}")
    result["start_quorum_ms"] = quorum_ms
    targets["start_quorum_n16_le_5ms"] = quorum_ms.get("n16", quorum_ms["n8"]) <= 5.0


def _library_share(restarts: _Restarts, result: dict[str, Any], targets: dict[str, bool]) -> None:
    # The library's share of a restart: the constructor plus everything from ready to
    # the first commit except the replica's own compute and its wait for the
    # survivors' step boundary; the lighthouse's own part of that wait (a steady
    # round, measured above at N=2) is counted back in.
    med = statistics.median
    step_time = ChaosConfig().step_time_s
    library = [
        s + r + result["start_quorum_ms"]["n2"] / 1e3
        for s, r in zip(restarts.library_start_s, restarts.after_wait_s, strict=False)
    ]
    library_s = med(library)
    with_wait_s = restarts.manager_start_s + max(0.0, restarts.ready_commit_s - step_time)
    print(
        f"\nlibrary share of a restart (median)         {library_s * 1e3:7.1f} ms   (torchft: 100-140 ms)"
    )
    print(f"  counting the wait for the survivors' step end too {with_wait_s * 1e3:5.1f} ms")
    result["library_share_ms"] = library_s * 1e3
    result["library_share_with_wait_ms"] = with_wait_s * 1e3
    targets["library_share_le_50ms"] = library_s <= 0.05


if __name__ == "__main__":
    main()
