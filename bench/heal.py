"""Heal transfer benchmark: HTTPTransport and PGTransport vs plain torch.save/torch.load.

A child process holds a ~400 MB fp32 state dict and serves it (HTTP server,
plain socket for the baseline, Gloo process group); this process receives it
and times each heal. Every row is the median of `--repeats` receives; the ratio
is baseline seconds / row seconds (> 1 means faster than plain torch).

    .venv/bin/python bench/heal.py [--mb 400] [--repeats 5] [--cold 2] [--budget-s 85]

Rows "new process" time the first heal of a freshly started receiver (what a
restarted replica does): its memory has never been touched, so page faults
cost more than in the rows that heal repeatedly in one process.

Prints a table, then one JSON line. Bounded: each receive has a 30 s timeout,
the whole run stops after --budget-s seconds, and every child is stopped by
pid at the end, even on failure.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from torchft_pg.checkpointing import HTTPTransport, PGTransport

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


def _cold(url: str, chunks: int, mb: int, in_place: bool, repeats: int) -> tuple[float, float]:
    """(median, best) seconds of `repeats` heals, each in a fresh process (start-up not timed)."""
    ctx = mp.get_context("spawn")
    times = []
    for _ in range(repeats):
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
    return statistics.median(times), min(times)


def _rounds(configs: list[tuple[str, Any]], repeats: int) -> list[tuple[str, float, float]]:
    """(name, median s, best s) per config, measured round-robin.

    Interleaving the configs spreads load from other processes on a shared
    machine evenly over the rows; each result is freed outside the timed region.
    """
    times: dict[str, list[float]] = {name: [] for name, _ in configs}
    for _ in range(repeats):
        for name, fn in configs:
            t0 = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            del out
    return [(name, statistics.median(times[name]), min(times[name])) for name, _ in configs]


def _over_budget(signum: int, frame: Any) -> None:
    raise TimeoutError("bench/heal.py ran past its --budget-s; stopping")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cold", type=int, default=2, help="heals in fresh processes per row")
    ap.add_argument("--budget-s", type=int, default=85, help="abort the whole run after this")
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _over_budget)
    signal.alarm(args.budget_s)  # the finally blocks below still stop every child by pid
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
        rows = _rounds(configs, args.repeats)
        for chunks, in_place in ((0, False), (4, False), (4, True)):
            label = (
                f"HTTPTransport num_chunks={chunks} new process{' in place' if in_place else ''}"
            )
            rows.append((label, *_cold(url, chunks, args.mb, in_place, args.cold)))
        for t in transports:
            t.shutdown()
        parent.send("stop")
        proc.join(10)
    finally:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, 9)
            proc.join(5)
    base = rows[0][1]
    print(
        f"\nheal of a {nbytes / 1e6:.0f} MB ({nbytes >> 20} MiB) fp32 state dict over loopback, "
        f"{args.repeats} rounds, rows interleaved; ratio = torch median / row median"
    )
    print(f"{'transport':<46}{'median s':>9}{'GB/s':>7}{'best s':>8}{'GB/s':>7}{'vs torch':>10}")
    for name, med, best in rows:
        print(
            f"{name:<46}{med:>9.3f}{nbytes / med / 1e9:>7.2f}{best:>8.3f}{nbytes / best / 1e9:>7.2f}"
            f"{base / med:>9.2f}x"
        )
    result = {
        "bench": "heal",
        "bytes": nbytes,
        "repeats": args.repeats,
        "rows": {
            name: {
                "median_s": round(med, 4),
                "median_GBps": round(nbytes / med / 1e9, 3),
                "best_s": round(best, 4),
                "ratio_vs_torch": round(base / med, 2),
            }
            for name, med, best in rows
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
