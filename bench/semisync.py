"""Semi-synchronous training benchmark: bytes and wall time per inner step, vs DDP.

3 replica groups (one process each, Gloo, a real lighthouse) train the same
4-block MLP (about 1.05 M float32 parameters, 4.2 MB) on their own random
batches, under four schemes, each against a fresh lighthouse in the same run:

* ``ddp``: `DistributedDataParallel` + `OptimizerWrapper`, gradients averaged every step;
* ``local_sgd``: `LocalSGD`, parameters averaged every `SYNC_EVERY` steps;
* ``diloco_1``: `DiLoCo`, one fragment, every `SYNC_EVERY` steps, its quorum and
  allreduce started ``SYNC_EVERY / 2`` inner steps early (`fragment_sync_delay`),
  so the allreduce overlaps them;
* ``diloco_4``: `DiLoCo`, 4 fragments (one per block), one fragment every
  ``SYNC_EVERY / 4`` steps, its allreduce started one inner step early.

Per scheme: the bytes each group hands to ``Manager.allreduce`` per inner
step (the payload; a ring allreduce puts ``2 (n - 1) / n`` times that on
each group's link, the same factor for every scheme), and the wall time per
inner step (the measured steps' total over their number, so sync steps
count; median over the groups), after one full sync window of warm-up.
``ratio`` columns are to ``ddp`` in the same run and variant.

Two variants: ``loopback`` (every group on 127.0.0.1), and ``rtt50ms``: each
group in its own network namespace, the lighthouses in another, every one
joined to a bridge by a veth pair with 25 ms of delay on its way out, so
groups are 50 ms apart in round-trip time (`bench/_latency.py`, addresses
from 198.18.0.0/15 only; netem where the kernel has it, else the
repository's userspace link emulator). Namespaces need root and ``ip``;
elsewhere the variant is skipped and the benchmark says why. The emulated
link adds latency only, no bandwidth cap.

Prints a table and, last, one JSON line. Bounded: about 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GROUPS = 3
SYNC_EVERY = 8
MEASURED_WINDOWS = 4  # after one window of warm-up
SCHEMES = ("ddp", "local_sgd", "diloco_1", "diloco_4")
# Inner steps a DiLoCo sync's quorum and allreduce start before its sync point.
SYNC_DELAY = {"diloco_1": SYNC_EVERY // 2, "diloco_4": 1}
WIDTH = 512
BATCH = 8
ONE_WAY_MS = 25.0  # the latency variant: each link's delay, each way (50 ms round trip)
LOOPBACK = "127.0.0.1"
# One job secret for the lighthouses and groups: on network namespaces their servers
# listen beyond loopback, which a job needs a secret for (lighthouse.exposure).
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHFT_JOB_SECRET": secrets.token_hex(16)}


def run_scheme(lighthouse: str, index: int, scheme: str, host: str) -> dict[str, Any]:
    """One group's run of `scheme`, bound to `host`: bytes and seconds over the
    measured inner steps."""
    import torch
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.ddp import DistributedDataParallel
    from torchft_pg.local_sgd import DiLoCo, LocalSGD
    from torchft_pg.manager import Manager
    from torchft_pg.optim import OptimizerWrapper

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(4)]
    model = torch.nn.Sequential(*blocks)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-4)
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=60), hostname=host),
        rank=0,
        world_size=1,
        store_addr=host,
        store_port=store.port,
        hostname=host,
        lighthouse_addr=lighthouse,
        replica_id=f"r{index}",
        min_replica_size=GROUPS,
        init_sync=False,
        use_async_quorum=not scheme.startswith("diloco"),
        timeout=timedelta(seconds=60),
        quorum_timeout=timedelta(seconds=120),
    )
    sent = [0]
    real_allreduce = manager.allreduce

    def counting_allreduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sent[0] += tensor.numel() * tensor.element_size()
        return real_allreduce(tensor, *args, **kwargs)

    manager.allreduce = counting_allreduce  # type: ignore[method-assign]
    forward: torch.nn.Module = model
    optimizer: torch.optim.Optimizer = inner
    wrapper: Any = None
    if scheme == "ddp":
        forward = DistributedDataParallel(manager, model)
        optimizer = OptimizerWrapper(manager, inner)
    elif scheme == "local_sgd":
        wrapper = LocalSGD(manager, model, inner, sync_every=SYNC_EVERY)
    else:
        fragments = [model] if scheme == "diloco_1" else blocks
        outer = [
            torch.optim.SGD(f.parameters(), lr=0.7, momentum=0.9, nesterov=True) for f in fragments
        ]
        wrapper = DiLoCo(
            manager,
            fragments,
            inner,
            outer,
            sync_every=SYNC_EVERY,
            fragment_sync_delay=SYNC_DELAY[scheme],
        )
    g = torch.Generator().manual_seed(index)
    batches = [torch.randn(BATCH, WIDTH, generator=g) for _ in range(4)]
    warmup, measured = SYNC_EVERY, MEASURED_WINDOWS * SYNC_EVERY
    try:
        if wrapper is not None:
            wrapper.__enter__()
        start = 0.0
        for step in range(warmup + measured):
            if step == warmup:
                sent[0] = 0
                start = time.perf_counter()
            x = batches[step % len(batches)]
            optimizer.zero_grad()
            forward(x).pow(2).mean().backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        if wrapper is not None:
            wrapper.__exit__(None, None, None)
        return {
            "bytes_per_step": sent[0] / measured,
            "ms_per_step": seconds / measured * 1000,
            "committed": manager.current_step(),
        }
    finally:
        manager.shutdown()


def round_trip_ms(address: str, tries: int = 5) -> float:
    """The median time of a TCP connect to `address` (``[http://]host:port``): one round trip."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        with socket.create_connection((host, int(port)), timeout=10):
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def worker(lighthouses: dict[str, str], index: int, host: str) -> None:
    out: dict[str, Any] = {"index": index, "rtt_ms": round_trip_ms(lighthouses["ddp"])}
    for scheme in SCHEMES:
        try:
            out[scheme] = run_scheme(lighthouses[scheme], index, scheme, host)
        except Exception as exc:  # reported, not raised: the parent tabulates failures
            out[scheme] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(out), flush=True)


def serve_lighthouses(host: str) -> None:
    """One lighthouse per scheme on `host`; print their addresses, serve until stdin closes."""
    from lighthouse import LighthouseServer

    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    servers = {s: LighthouseServer(bind=f"{host}:0", min_replicas=GROUPS) for s in SCHEMES}
    try:
        print(json.dumps({s: lh.address() for s, lh in servers.items()}), flush=True)
        sys.stdin.read()  # until the parent closes our stdin or kills us
    finally:
        for lh in servers.values():
            lh.shutdown()


def worker_argv(index: int, host: str, lighthouses: str) -> list[str]:
    return [sys.executable, __file__, "--worker", lighthouses, str(index), host]


def outputs_to_results(outputs: list[str]) -> list[dict[str, Any]]:
    results = []
    for out in outputs:
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if lines:
            results.append(json.loads(lines[-1]))
    return results


def run_loopback() -> list[dict[str, Any]]:
    """Every group on 127.0.0.1. The lighthouses run in a process of their own, as
    in the latency variant (this one never forks while holding gRPC threads)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        lighthouses = subprocess.Popen(
            [sys.executable, __file__, "--lighthouses", LOOPBACK],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ENV,
        )
        procs.append(lighthouses)
        assert lighthouses.stdout is not None
        addresses = lighthouses.stdout.readline().strip()  # once listening, or '' if it died
        if not addresses.startswith("{"):
            raise RuntimeError(f"the lighthouse process did not start: {addresses!r}")
        workers = [
            subprocess.Popen(
                worker_argv(i, LOOPBACK, addresses),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=ENV,
            )
            for i in range(GROUPS)
        ]
        procs.extend(workers)
        return outputs_to_results([p.communicate(timeout=600)[0] for p in workers])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # by its own pid
            p.wait(timeout=10)
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()


def run_latency() -> tuple[list[dict[str, Any]], str]:
    """Each group in its own namespace, 50 ms round trip apart; (results, how the links were slowed)."""
    from bench._latency import LH_ADDR, run_with_latency

    run = run_with_latency(
        GROUPS,
        ONE_WAY_MS,
        [sys.executable, __file__, "--lighthouses", LH_ADDR],
        worker_argv,
        ENV,
    )
    return outputs_to_results(list(run.outputs)), run.impairment


def tabulate(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scheme: the median over the groups, and the ratios to ``ddp``."""
    table: dict[str, dict[str, Any]] = {}
    for scheme in SCHEMES:
        runs = [r[scheme] for r in results if "error" not in r.get(scheme, {"error": 1})]
        errors = sorted({r[scheme]["error"] for r in results if "error" in r.get(scheme, {})})
        table[scheme] = {
            "groups_ok": len(runs),
            "bytes_per_step": statistics.median(r["bytes_per_step"] for r in runs)
            if runs
            else float("nan"),
            "ms_per_step": statistics.median(r["ms_per_step"] for r in runs)
            if runs
            else float("nan"),
            "errors": errors[:2],
        }
    ddp = table["ddp"]
    for r in table.values():
        r["bytes_ratio"] = round(r["bytes_per_step"] / ddp["bytes_per_step"], 4)
        r["time_ratio"] = round(r["ms_per_step"] / ddp["ms_per_step"], 3)
    return table


def print_table(variant: str, table: dict[str, dict[str, Any]]) -> None:
    for scheme, r in table.items():
        print(
            f"{variant:<10}{scheme:<10}{r['groups_ok']:>5}/{GROUPS}{r['bytes_per_step'] / 1024:>11.1f}"
            f"{r['ms_per_step']:>9.2f}{r['bytes_ratio']:>13.4f}{r['time_ratio']:>12.3f}"
        )
        for e in r["errors"]:
            print(f"      error: {e}")


def ratios(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {s: {"bytes": r["bytes_ratio"], "time": r["time_ratio"]} for s, r in table.items()}


def main() -> int:
    from bench._latency import unavailable

    t0 = time.monotonic()
    loopback = tabulate(run_loopback())
    why_not = unavailable()  # not root, no `ip`, namespaces refused: says which
    latency: dict[str, dict[str, Any]] | None = None
    latency_json: dict[str, Any] | str = f"skipped: {why_not}"
    failed = False
    if why_not is None:
        try:
            results, impairment = run_latency()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            failed = True  # its namespaces are gone already (`Network`)
            latency_json = f"failed: {type(e).__name__}: {e}"
        else:
            latency = tabulate(results)
            rtts = [r["rtt_ms"] for r in results]
            latency_json = {
                "rtt_ms_target": 2 * ONE_WAY_MS,
                "rtt_ms_measured": round(statistics.median(rtts), 1) if rtts else None,
                "impairment": impairment,
                "results": latency,
                "ratios_vs_ddp": ratios(latency),
            }
    print(
        f"{'variant':<10}{'scheme':<10}{'groups':>7}{'KB/step':>11}{'ms/step':>9}"
        f"{'bytes ratio':>13}{'time ratio':>12}"
    )
    print_table("loopback", loopback)
    if latency is not None:
        print_table("rtt50ms", latency)
    else:
        print(f"rtt50ms   {latency_json}")
    print(
        json.dumps(
            {
                "bench": "semisync",
                "groups": GROUPS,
                "sync_every": SYNC_EVERY,
                "fragment_sync_delay": SYNC_DELAY,
                "measured_inner_steps": MEASURED_WINDOWS * SYNC_EVERY,
                "results": loopback,
                "ratios_vs_ddp": ratios(loopback),
                "latency_variant": latency_json,
                "wall_s": round(time.monotonic() - t0, 1),
                "cpus": os.cpu_count(),
            }
        )
    )
    tables = [loopback] if latency is None else [loopback, latency]
    ok = all(r["groups_ok"] == GROUPS for t in tables for r in t.values())
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--lighthouses":
        serve_lighthouses(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
