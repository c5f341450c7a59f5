"""Heal transfer benchmark: HTTPTransport and PGTransport vs plain torch.save/torch.load.

A child process holds a ~400 MB fp32 state dict and serves it (HTTP server,
plain socket for the baseline, Gloo process group); this process receives it
and times each heal. In-process rows run round-robin for up to `--repeats`
rounds (so load from other jobs spreads evenly) and report median and best;
the ratio is baseline median / row median (> 1 means faster than plain torch).
The machine's load average is printed with the table: on a shared box, read
figures taken under load as lower bounds.

    .venv/bin/python bench/heal.py [--mb 400] [--repeats 5] [--cold 2] [--budget-s 70]

Rows "new process" time the first heal of a freshly started receiver (what a
restarted replica does): its memory has never been touched, so page faults
cost more than in the rows that heal repeatedly in one process.

Prints a table, then one JSON line. Bounded: each receive has a 30 s timeout;
no round starts after 60% of --budget-s and no new-process heal after
--budget-s (rows show how many samples they got); a hard stop fires 15 s after
the budget; every child is stopped by pid at the end, even on failure.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

_T0 = time.monotonic()  # the run's budget counts from here, imports included
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torchft_pg.checkpointing import HTTPTransport, PGTransport  # noqa: E402

TIMEOUT = timedelta(seconds=30)
STEP = 7


def make_state_dict(mb: int) -> dict[str, Any]:
    """~`mb` MB of fp32: 16 large tensors plus small ones and optimizer-like leaves."""
    big = mb * 1024 * 1024 // 4 // 16
    g = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(big, generator=g) for i in range(16)}
    model.update({f"layer{i}.bias": torch.randn(256, generator=g) for i in range(16)})
    optim = {
        "state": {0: {"step": torch.tensor(10.0)}},
        "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99)}],
    }
    return {"model": model, "optim": optim, "step": STEP}


def _serve_baseline(sd: dict[str, Any], srv: socket.socket) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn, conn.makefile("wb") as f:
            torch.save(sd, f)


def child(mb: int, conn: Connection, store_port: int) -> None:
    """The up-to-date replica: serves over HTTP, a plain socket, and Gloo rank 0."""
    sd = make_state_dict(mb)
    http = HTTPTransport[dict[str, Any]](TIMEOUT, bind_host="127.0.0.1")
    http.send_checkpoint([1], STEP, sd, TIMEOUT)
    srv = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_serve_baseline, args=(sd, srv), daemon=True).start()
    store = dist.TCPStore("127.0.0.1", store_port, 2, False, timeout=TIMEOUT)
    pg = dist.ProcessGroupGloo(store, 0, 2, TIMEOUT)
    pgt = PGTransport[dict[str, Any]](pg, TIMEOUT, torch.device("cpu"))
    conn.send((http.metadata(), srv.getsockname()[1]))
    while True:
        cmd = conn.recv()
        if cmd == "pg":
            pgt.send_checkpoint([1], STEP, sd, TIMEOUT)
            conn.send("ok")
        else:
            break
    srv.close()
    http.shutdown()


def cold_receiver(url: str, chunks: int, mb: int, in_place: bool, conn: Connection) -> None:
    """One heal in a brand-new process (a restarted replica), optionally into its own model.

    With `in_place`, the process first builds its state dict (like a model
    initialised before its first quorum; not timed), then heals into it.
    """
    mine = make_state_dict(mb) if in_place else None
    t = HTTPTransport[dict[str, Any]](
        TIMEOUT,
        num_chunks=chunks,
        bind_host="127.0.0.1",
        state_dict=(lambda: mine) if in_place else None,
    )
    t0 = time.perf_counter()
    t.recv_checkpoint(0, url, STEP, TIMEOUT)
    conn.send(time.perf_counter() - t0)
    t.shutdown()


Row = tuple[str, float, float, int]  # name, median s, best s, samples


def _cold(
    url: str, chunks: int, mb: int, in_place: bool, repeats: int, until: float
) -> list[float]:
    """Seconds of up to `repeats` heals, each in a fresh process (start-up not timed).

    No new heal starts after monotonic time `until` (the run's budget).
    """
    ctx = mp.get_context("spawn")
    times: list[float] = []
    for _ in range(repeats):
        if time.monotonic() > until:
            break
        parent, child_conn = ctx.Pipe()
        proc = ctx.Process(
            target=cold_receiver, args=(url, chunks, mb, in_place, child_conn), daemon=True
        )
        proc.start()
        try:
            if not parent.poll(60):
                raise RuntimeError("cold receiver did not report within 60 s")
            times.append(parent.recv())
            proc.join(10)
        finally:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, 9)
                proc.join(5)
    return times


def _rounds(configs: list[tuple[str, Any]], repeats: int, until: float) -> dict[str, list[float]]:
    """Seconds per config, measured round-robin for up to `repeats` rounds.

    Interleaving the configs spreads load from other processes on a shared
    machine evenly over the rows; each result is freed outside the timed region.
    After the first round, no round starts past monotonic time `until`.
    """
    times: dict[str, list[float]] = {name: [] for name, _ in configs}
    for r in range(repeats):
        if r > 0 and time.monotonic() > until:
            break
        for name, fn in configs:
            t0 = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            del out
    return times


def _report(samples: dict[str, list[float]], nbytes: int, budget_s: int) -> None:
    """Print the table and the final JSON line."""
    rows: list[Row] = [
        (name, statistics.median(ts), min(ts), len(ts)) for name, ts in samples.items() if ts
    ]
    skipped = [name for name, ts in samples.items() if not ts]
    base = rows[0][1]
    print(
        f"\nheal of a {nbytes / 1e6:.0f} MB ({nbytes >> 20} MiB) fp32 state dict over loopback; "
        f"in-process rows interleaved round-robin; ratio = torch median / row median; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'transport':<46}{'n':>3}{'median s':>9}{'GB/s':>7}{'best s':>8}{'GB/s':>7}{'vs torch':>10}"
    )
    for name, med, best, n in rows:
        print(
            f"{name:<46}{n:>3}{med:>9.3f}{nbytes / med / 1e9:>7.2f}{best:>8.3f}"
            f"{nbytes / best / 1e9:>7.2f}{base / med:>9.2f}x"
        )
    for name in skipped:
        print(f"{name:<46}  skipped: --budget-s {budget_s} reached")
    result = {
        "bench": "heal",
        "bytes": nbytes,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "seconds": round(time.monotonic() - _T0, 1),
        "rows": {
            name: {
                "n": n,
                "median_s": round(med, 4),
                "median_GBps": round(nbytes / med / 1e9, 3),
                "best_s": round(best, 4),
                "ratio_vs_torch": round(base / med, 2),
            }
            for name, med, best, n in rows
        },
        "skipped": skipped,
    }
    print(json.dumps(result))


def _over_budget(signum: int, frame: Any) -> None:
    raise TimeoutError("bench/heal.py ran past its hard limit; stopping")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cold", type=int, default=2, help="heals in fresh processes per row")
    ap.add_argument(
        "--budget-s", type=int, default=70, help="start no new measurement after this (s)"
    )
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _over_budget)  # hard stop 15 s after the budget;
    signal.alarm(max(1, int(args.budget_s + 15 - (time.monotonic() - _T0))))  # children die by pid
    soft_end = _T0 + args.budget_s
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    parent, child_conn = ctx.Pipe()
    proc = ctx.Process(target=child, args=(args.mb, child_conn, store.port), daemon=True)
    proc.start()
    try:
        pg = dist.ProcessGroupGloo(store, 1, 2, TIMEOUT)
        if not parent.poll(60):
            raise RuntimeError("bench child did not start within 60 s")
        url, base_port = parent.recv()
        nbytes = sum(t.numel() * 4 for t in make_state_dict(args.mb)["model"].values())

        def baseline() -> Any:
            with socket.create_connection(("127.0.0.1", base_port)) as s, s.makefile("rb") as f:
                data = f.read()
            return torch.load(io.BytesIO(data), weights_only=True)

        configs: list[tuple[str, Any]] = [("torch.save/load via socket (baseline)", baseline)]
        transports: list[HTTPTransport[dict[str, Any]]] = []
        for chunks in (0, 4):
            for in_place in (False, True):
                holder: dict[str, Any] = {}
                t = HTTPTransport[dict[str, Any]](
                    TIMEOUT,
                    num_chunks=chunks,
                    bind_host="127.0.0.1",
                    state_dict=(lambda h=holder: h.get("sd")) if in_place else None,
                )
                transports.append(t)
                if in_place:
                    holder["sd"] = t.recv_checkpoint(0, url, STEP, TIMEOUT)
                label = f"HTTPTransport num_chunks={chunks}{' in place' if in_place else ''}"
                configs.append((label, lambda t=t: t.recv_checkpoint(0, url, STEP, TIMEOUT)))
        for in_place in (False, True):
            dst: dict[str, Any] = {}
            pgt = PGTransport[dict[str, Any]](
                pg,
                TIMEOUT,
                torch.device("cpu"),
                state_dict=(lambda d=dst: d.get("sd")) if in_place else None,
            )

            def pg_recv(pgt: PGTransport[dict[str, Any]] = pgt) -> Any:
                parent.send("pg")
                out = pgt.recv_checkpoint(0, "<n/a>", STEP, TIMEOUT)
                parent.recv()
                return out

            if in_place:
                dst["sd"] = pg_recv()
            configs.append((f"PGTransport gloo{' in place' if in_place else ''}", pg_recv))
        samples = _rounds(configs, args.repeats, _T0 + 0.6 * args.budget_s)
        for chunks, in_place in ((0, False), (4, False), (4, True)):
            label = (
                f"HTTPTransport num_chunks={chunks} new process{' in place' if in_place else ''}"
            )
            samples[label] = _cold(url, chunks, args.mb, in_place, args.cold, soft_end)
        signal.alarm(0)  # measured: report before any teardown can stall
        _report(samples, nbytes, args.budget_s)
        for t in transports:
            t.shutdown()
        parent.send("stop")
        proc.join(3)
    finally:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, 9)
            proc.join(5)


if __name__ == "__main__":
    main()
