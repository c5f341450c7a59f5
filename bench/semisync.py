"""Semi-synchronous training benchmark: bytes and wall time per inner step, vs DDP.

3 replica groups (one process each, Gloo over loopback, a real lighthouse)
train the same 4-block MLP (about 1.05 M float32 parameters, 4.2 MB) on
their own random batches, under four schemes, each against a fresh
lighthouse in the same run:

* ``ddp``: `DistributedDataParallel` + `OptimizerWrapper`, gradients averaged every step;
* ``local_sgd``: `LocalSGD`, parameters averaged every `SYNC_EVERY` steps;
* ``diloco_1``: `DiLoCo`, one fragment, every `SYNC_EVERY` steps;
* ``diloco_4``: `DiLoCo`, 4 fragments (one per block), one fragment every
  ``SYNC_EVERY / 4`` steps, its allreduce started one inner step early.

Per scheme: the bytes each group hands to ``Manager.allreduce`` per inner
step (the payload; a ring allreduce puts ``2 (n - 1) / n`` times that on
each group's link, the same factor for every scheme), and the wall time per
inner step (the measured steps' total over their number, so sync steps
count; median over the groups), after one full sync window of warm-up.
``ratio`` columns are to ``ddp`` in the same run.

Left out: the variant with emulated WAN latency and bandwidth between the
groups (network namespaces), where the semi-synchronous schemes' gain in
wall time shows; on loopback the time columns mostly measure compute and
the per-sync quorum.

Prints a table and, last, one JSON line. Bounded: about a minute on 2 cores.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GROUPS = 3
SYNC_EVERY = 8
MEASURED_WINDOWS = 4  # after one window of warm-up
SCHEMES = ("ddp", "local_sgd", "diloco_1", "diloco_4")
WIDTH = 512
BATCH = 8
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run_scheme(lighthouse: str, index: int, scheme: str) -> dict[str, Any]:
    """One group's run of `scheme`: bytes and seconds over the measured inner steps."""
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
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=60)),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
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
            fragment_sync_delay=0 if scheme == "diloco_1" else 1,
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


def worker(lighthouses: dict[str, str], index: int) -> None:
    out: dict[str, Any] = {"index": index}
    for scheme in SCHEMES:
        try:
            out[scheme] = run_scheme(lighthouses[scheme], index, scheme)
        except Exception as exc:  # reported, not raised: the parent tabulates failures
            out[scheme] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(out), flush=True)


def main() -> int:
    from lighthouse import LighthouseServer

    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    t0 = time.monotonic()
    servers = {s: LighthouseServer(bind="127.0.0.1:0", min_replicas=GROUPS) for s in SCHEMES}
    addresses = json.dumps({s: lh.address() for s, lh in servers.items()})
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", addresses, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ENV,
        )
        for i in range(GROUPS)
    ]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=600)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if lines:
                results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # by its own pid
                p.wait(timeout=10)
        for lh in servers.values():
            lh.shutdown()

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
    print(
        f"{'scheme':<10}{'groups':>7}{'KB/step':>11}{'ms/step':>9}{'bytes ratio':>13}{'time ratio':>12}"
    )
    for scheme, r in table.items():
        r["bytes_ratio"] = round(r["bytes_per_step"] / ddp["bytes_per_step"], 4)
        r["time_ratio"] = round(r["ms_per_step"] / ddp["ms_per_step"], 3)
        print(
            f"{scheme:<10}{r['groups_ok']:>5}/{GROUPS}{r['bytes_per_step'] / 1024:>11.1f}"
            f"{r['ms_per_step']:>9.2f}{r['bytes_ratio']:>13.4f}{r['time_ratio']:>12.3f}"
        )
        for e in r["errors"]:
            print(f"      error: {e}")
    print(
        json.dumps(
            {
                "bench": "semisync",
                "groups": GROUPS,
                "sync_every": SYNC_EVERY,
                "measured_inner_steps": MEASURED_WINDOWS * SYNC_EVERY,
                "results": table,
                "ratios_vs_ddp": {
                    s: {"bytes": r["bytes_ratio"], "time": r["time_ratio"]}
                    for s, r in table.items()
                },
                "latency_variant": "not run (no network namespaces in this benchmark)",
                "wall_s": round(time.monotonic() - t0, 1),
                "cpus": os.cpu_count(),
            }
        )
    )
    return 0 if all(r["groups_ok"] == GROUPS for r in table.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
