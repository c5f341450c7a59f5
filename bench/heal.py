"""Heal transfer benchmark: HTTPTransport and PGTransport vs one plain TCP stream.

A child process holds a ~400 MiB fp32 state dict and serves it (our HTTP
server, a plain socket, ``torch.save`` over a socket, a Gloo process group);
this process receives it and times each heal. The reference is one loopback
TCP stream moving the same tensor bytes with ``sendall`` / ``recv_into``
straight into tensors allocated once (no framing, no checksum, no copy): what
any transport over one connection costs at least. A second plain row receives
into fresh tensors each time, the memory a receiver without a state dict of its
own must fault in.

The machine may be shared, so every in-process row is measured once per round,
in an order shuffled per round (fixed seeds), for up to ``--repeats`` rounds; a
row's figure is its median, and its ratio is the median over rounds of (row /
TCP stream in the same round): a paired comparison, so load that comes and goes
hits both sides of each pair. Each row also shows the CPU seconds both ends
used per heal (from /proc, all threads, 10 ms ticks; median): the work that
load on the machine turns into wall time. The load average is printed too.

    .venv/bin/python bench/heal.py [--mb 400] [--repeats 9] [--cold 2] [--budget-s 120]
                                   [--chunks 0] [--no-save] [--torchft-python PATH]

``--chunks`` adds HTTPTransport rows with those ``num_chunks`` (0: one stream)
beside the default (``num_chunks`` left out). The last lines say whether the
default HTTP heal is within 1.10x one TCP stream, and its ratio to the stream
into fresh tensors (it receives into fresh memory too).

With ``TORCHFT_PYTHON`` (or ``--torchft-python PATH``), a python that has
torchft installed, torchft's ``HTTPTransport`` and ``PGTransport`` (Gloo) run
in the same rounds, in two processes of that python (a sender with the same
state dict, and a receiver); their rows are timed here from the command to the
receiver's answer (two pipe hops, well under a millisecond). torchft's HTTP
servers listen on every interface (it has no bind option) while they run.
Without it the torchft rows are skipped, and the output says so.

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
import functools
import io
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import IO, Any

_T0 = time.monotonic()  # the run's budget counts from here, imports included
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

TIMEOUT = timedelta(seconds=30)
STEP = 7
BASELINE = "one TCP stream, sendall/recv_into (baseline)"
FRESH = "one TCP stream into fresh tensors"
TARGET = 1.10  # the default HTTP heal's goal, in one-TCP-stream medians


def make_state_dict(mb: int) -> dict[str, Any]:
    """~`mb` MiB of fp32: 16 large tensors plus small ones and optimizer-like leaves."""
    big = mb * 1024 * 1024 // 4 // 16
    g = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(big, generator=g) for i in range(16)}
    model.update({f"layer{i}.bias": torch.randn(256, generator=g) for i in range(16)})
    optim = {
        "state": {0: {"step": torch.tensor(10.0)}},
        "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99)}],
    }
    return {"model": model, "optim": optim, "step": STEP}


def model_tensors(sd: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors the plain stream moves, in a fixed order (the model's)."""
    return list(sd["model"].values())


def _byte_view(t: torch.Tensor) -> memoryview:
    """A writable view of a contiguous CPU tensor's bytes (no copy)."""
    from torchft_pg.checkpointing.layout import byte_view

    return byte_view(t)


def _serve_forever(srv: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            handle(conn)


def _send_raw(tensors: list[torch.Tensor], conn: socket.socket) -> None:
    for t in tensors:  # straight from the tensor's memory: no copy in Python
        conn.sendall(_byte_view(t))


def _send_torch_save(sd: dict[str, Any], conn: socket.socket) -> None:
    with conn.makefile("wb") as f:
        torch.save(sd, f)


def child(mb: int, conn: Connection, store_port: int) -> None:
    """The up-to-date replica: serves over HTTP, two plain sockets, and Gloo rank 0."""
    import torch.distributed as dist

    from torchft_pg.checkpointing import HTTPTransport, PGTransport

    sd = make_state_dict(mb)
    http = HTTPTransport[dict[str, Any]](TIMEOUT, bind_host="127.0.0.1")
    http.send_checkpoint([1], STEP, sd, TIMEOUT)
    raw = socket.create_server(("127.0.0.1", 0))
    save = socket.create_server(("127.0.0.1", 0))
    tensors = model_tensors(sd)
    for srv, handle in (
        (raw, lambda c: _send_raw(tensors, c)),
        (save, lambda c: _send_torch_save(sd, c)),
    ):
        threading.Thread(target=_serve_forever, args=(srv, handle), daemon=True).start()
    store = dist.TCPStore("127.0.0.1", store_port, 2, False, timeout=TIMEOUT)
    pg: Any = dist.ProcessGroupGloo(store, 0, 2, TIMEOUT)  # c10d's stub: not SendRecvGroup
    pgt = PGTransport[dict[str, Any]](pg, TIMEOUT, torch.device("cpu"))
    conn.send((http.metadata(), raw.getsockname()[1], save.getsockname()[1]))
    while True:
        cmd = conn.recv()
        if cmd == "pg":
            pgt.send_checkpoint([1], STEP, sd, TIMEOUT)
            conn.send("ok")
        else:
            break
    raw.close()
    save.close()
    http.shutdown()


def recv_raw(port: int, into: list[torch.Tensor]) -> list[torch.Tensor]:
    """One plain TCP stream: every tensor's bytes, `recv_into` its memory."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        for t in into:
            view = _byte_view(t)
            got = 0
            while got < len(view):
                k = s.recv_into(view[got:])
                if not k:
                    raise ConnectionError(f"plain stream closed after {got} of {len(view)} bytes")
                got += k
    return into


def _holding(sd: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """A `state_dict` callable returning `sd`."""
    return lambda: sd


def _chunks_kw(chunks: int | None) -> dict[str, Any]:
    """HTTPTransport keywords: ``num_chunks=chunks``, or none (its default) for None."""
    return {} if chunks is None else {"num_chunks": chunks}


def cold_receiver(url: str, chunks: int | None, mb: int, in_place: bool, conn: Connection) -> None:
    """One heal in a brand-new process (a restarted replica), optionally into its own model.

    With `in_place`, the process first builds its state dict (like a model
    initialised before its first quorum; not timed), then heals into it.
    """
    from torchft_pg.checkpointing import HTTPTransport

    t = HTTPTransport[dict[str, Any]](
        TIMEOUT,
        bind_host="127.0.0.1",
        state_dict=_holding(make_state_dict(mb)) if in_place else None,
        **_chunks_kw(chunks),
    )
    t0 = time.perf_counter()
    t.recv_checkpoint(0, url, STEP, TIMEOUT)
    conn.send(time.perf_counter() - t0)
    t.shutdown()


def _cold(
    url: str, chunks: int | None, mb: int, in_place: bool, repeats: int, until: float
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


# --- torchft, in processes of its own python (they import torchft, never torchft_pg) ---


def torchft_peer(role: str, mb: int, store_port: int) -> None:
    """torchft's side (run by the torchft python): `role` "sender" serves and sends
    the state dict; "receiver" heals from it on each command read from stdin.

    Protocol, one line each way: the sender prints its HTTP address; each
    command line ("http", "pg", "pg in place", "stop") is answered "ok" once done.
    """
    import torch.distributed as dist
    from torchft.checkpointing.http_transport import HTTPTransport
    from torchft.checkpointing.pg_transport import PGTransport

    rank = 0 if role == "sender" else 1
    store = dist.TCPStore("127.0.0.1", store_port, 2, False, timeout=TIMEOUT)
    pg = dist.ProcessGroupGloo(store, rank, 2, TIMEOUT)
    mine: dict[str, Any] = {}
    pgt = PGTransport(pg, TIMEOUT, torch.device("cpu"))  # type: ignore[arg-type]
    pgt_in_place = PGTransport(pg, TIMEOUT, torch.device("cpu"), state_dict=lambda: mine["sd"])  # type: ignore[arg-type]
    if role == "sender":
        sd = make_state_dict(mb)
        http = HTTPTransport(TIMEOUT, num_chunks=0)
        http.send_checkpoint([1], STEP, sd, TIMEOUT)
        print(json.dumps({"address": http.metadata()}), flush=True)
    else:
        receiver = HTTPTransport(TIMEOUT, num_chunks=0)
        url = json.loads(sys.stdin.readline())["address"]
        mine["sd"] = make_state_dict(mb)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "stop":
            break
        if role == "sender":
            if cmd.startswith("pg"):
                pgt.send_checkpoint([1], STEP, sd, TIMEOUT)
        elif cmd == "http":
            receiver.recv_checkpoint(0, url, STEP, TIMEOUT)
        elif cmd == "pg":
            pgt.recv_checkpoint(0, "<n/a>", STEP, TIMEOUT)
        elif cmd == "pg in place":
            pgt_in_place.recv_checkpoint(0, "<n/a>", STEP, TIMEOUT)
        print("ok", flush=True)


class TorchftPair:
    """torchft's sender and receiver processes, and one timed heal per `heal` call."""

    def __init__(self, python: str, mb: int) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore(
            "127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # torchft, not our tree
        # Their stderr (torchft logs every request there) goes to a file, shown on failure;
        # closed in `stop`.
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                [
                    python,
                    "-W",
                    "ignore",
                    os.path.abspath(__file__),
                    "--torchft-peer",
                    role,
                    str(mb),
                    str(self._store.port),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
                env=env,
                cwd="/",
            )
            for role in ("sender", "receiver")
        ]
        self.sender, self.receiver = self.procs
        address = self._line(self.sender, 120)
        self._say(self.receiver, address)

    def _say(self, proc: subprocess.Popen[str], line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line.strip() + "\n")
        proc.stdin.flush()

    def _line(self, proc: subprocess.Popen[str], timeout_s: float) -> str:
        out: IO[str] | None = proc.stdout
        assert out is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not got or not got[0]:
            self._log.seek(0)
            tail = self._log.read()[-2000:]
            raise RuntimeError(
                f"torchft peer (pid {proc.pid}) did not answer within {timeout_s} s; "
                f"its stderr ends:\n{tail}"
            )
        return got[0]

    def heal(self, cmd: str) -> None:
        if cmd.startswith("pg"):
            self._say(self.sender, cmd)
        self._say(self.receiver, cmd)
        self._line(self.receiver, 60)
        if cmd.startswith("pg"):
            self._line(self.sender, 60)

    def stop(self) -> None:
        for proc in self.procs:
            try:
                self._say(proc, "stop")
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if proc.poll() is None:
                os.kill(proc.pid, 9)
                proc.wait(5)
        self._log.close()


# --- measurement and report ---


Config = tuple[str, Callable[[], Any], tuple[int, ...]]  # name, one heal, pids of both ends


def _cpu_seconds(pids: tuple[int, ...]) -> float | None:
    """CPU seconds (user + system, all threads) the processes `pids` used so far;
    None where /proc cannot say. Resolution: one clock tick (10 ms)."""
    total = 0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _rounds(
    configs: list[Config], repeats: int, until: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per config, and CPU seconds its two ends used, measured round-robin
    for up to `repeats` rounds.

    CPU time is what load on a shared machine inflates wall time with: a row
    that does more work falls behind further when cores are scarce.

    Interleaving the configs spreads load from other processes on a shared
    machine evenly over the rows; each result is freed outside the timed region.
    Each round runs the configs in its own order (a fixed seed per round): a row
    that receives into fresh memory finds the allocator as its predecessor left
    it (memory just freed is reused without page faults), and with a fixed order
    one row always paid for its predecessor's pattern (a row measured 1.7x its
    identical twin). After the first round, no round starts past monotonic time `until`.
    """
    times: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    for r in range(repeats):
        if r > 0 and time.monotonic() > until:
            break
        order = list(configs)
        random.Random(r).shuffle(order)
        for name, fn, pids in order:
            c0 = _cpu_seconds(pids)
            t0 = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            c1 = _cpu_seconds(pids)
            if c0 is not None and c1 is not None:
                cpu[name].append(c1 - c0)
            del out
    return times, cpu


def _paired(ts: list[float], base: list[float]) -> float | None:
    """Median over rounds of row / baseline, both from the same round."""
    pairs = [t / b for t, b in zip(ts, base, strict=False) if b > 0]
    return statistics.median(pairs) if pairs else None


def _report(
    samples: dict[str, list[float]],
    cpu: dict[str, list[float]],
    paired_rows: set[str],
    nbytes: int,
    budget_s: int,
    default_row: str,
    torchft_note: str,
) -> None:
    """Print the table and the final JSON line."""
    base = samples[BASELINE]
    base_med = statistics.median(base)
    print(
        f"\nheal of a {nbytes / 1e6:.0f} MB ({nbytes >> 20} MiB) fp32 state dict over loopback; "
        f"rows interleaved round-robin; x TCP = median over rounds of row / TCP stream "
        f"(same round), new-process rows: row median / TCP median; CPU s = median CPU "
        f"seconds both ends used per heal; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'transport':<58}{'n':>3}{'median s':>9}{'GB/s':>7}{'best s':>8}{'x TCP':>8}{'CPU s':>7}"
    )
    rows: dict[str, dict[str, Any]] = {}
    for name, ts in samples.items():
        if not ts:
            print(f"{name:<58}  skipped: --budget-s {budget_s} reached")
            continue
        med = statistics.median(ts)
        ratio = _paired(ts, base) if name in paired_rows else med / base_med
        assert ratio is not None
        used = statistics.median(cpu[name]) if cpu.get(name) else None
        rows[name] = {
            "n": len(ts),
            "median_s": round(med, 4),
            "median_GBps": round(nbytes / med / 1e9, 3),
            "best_s": round(min(ts), 4),
            "x_tcp_stream": round(ratio, 3),
            "cpu_s": None if used is None else round(used, 3),
        }
        print(
            f"{name:<58}{len(ts):>3}{med:>9.3f}{nbytes / med / 1e9:>7.2f}{min(ts):>8.3f}"
            f"{ratio:>7.2f}x" + ("" if used is None else f"{used:>7.2f}")
        )
    print(torchft_note)
    # The default receive (no state dict of its own) lands in fresh memory, so it is
    # also compared with the plain stream into fresh tensors: the same page faults.
    vs_fresh = _paired(samples[default_row], samples[FRESH]) if samples.get(default_row) else None
    in_place = f"{default_row}, in place"
    met = default_row in rows and rows[default_row]["x_tcp_stream"] <= TARGET
    if default_row in rows:
        print(
            f"target: default HTTP heal <= {TARGET:.2f}x one TCP stream: "
            f"{'met' if met else 'not met'} ({rows[default_row]['x_tcp_stream']:.3f}x); "
            f"{vs_fresh:.2f}x the TCP stream into fresh tensors (the same memory work); "
            + (f"in place {rows[in_place]['x_tcp_stream']:.2f}x" if in_place in rows else "")
        )
    print(
        json.dumps(
            {
                "bench": "heal",
                "bytes": nbytes,
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "seconds": round(time.monotonic() - _T0, 1),
                "rows": rows,
                "skipped": [name for name, ts in samples.items() if not ts],
                "default_http_x_tcp_stream": rows.get(default_row, {}).get("x_tcp_stream"),
                "default_http_x_tcp_stream_fresh": None if vs_fresh is None else round(vs_fresh, 3),
                "default_http_in_place_x_tcp_stream": rows.get(in_place, {}).get("x_tcp_stream"),
                "target_met": met,
                "torchft": torchft_note,
            }
        )
    )


def _over_budget(signum: int, frame: Any) -> None:
    raise TimeoutError("bench/heal.py ran past its hard limit; stopping")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cold", type=int, default=2, help="heals in fresh processes per row")
    ap.add_argument(
        "--budget-s", type=int, default=120, help="start no new measurement after this (s)"
    )
    ap.add_argument(
        "--chunks",
        default="0",
        help="also run HTTPTransport with these num_chunks (comma-separated; '' for none)",
    )
    ap.add_argument(
        "--torchft-python",
        default=os.environ.get("TORCHFT_PYTHON"),
        help="a python with torchft installed: also run torchft's transports (env TORCHFT_PYTHON)",
    )
    ap.add_argument("--no-save", action="store_true", help="skip the torch.save/load row")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    import torch.distributed as dist

    from torchft_pg.checkpointing import HTTPTransport, PGTransport

    signal.signal(signal.SIGALRM, _over_budget)  # hard stop 15 s after the budget;
    signal.alarm(max(1, int(args.budget_s + 15 - (time.monotonic() - _T0))))  # children die by pid
    soft_end = _T0 + args.budget_s
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    parent, child_conn = ctx.Pipe()
    proc = ctx.Process(target=child, args=(args.mb, child_conn, store.port), daemon=True)
    proc.start()
    torchft: TorchftPair | None = None
    transports: list[HTTPTransport[dict[str, Any]]] = []
    try:
        pg: Any = dist.ProcessGroupGloo(store, 1, 2, TIMEOUT)
        if not parent.poll(60):
            raise RuntimeError("bench child did not start within 60 s")
        url, raw_port, save_port = parent.recv()
        mine = make_state_dict(args.mb)
        nbytes = sum(t.numel() * t.element_size() for t in model_tensors(mine))
        prealloc = [torch.empty_like(t) for t in model_tensors(mine)]
        recv_raw(raw_port, prealloc)  # touched once: later rounds reuse the memory

        def fresh() -> list[torch.Tensor]:
            return recv_raw(raw_port, [torch.empty_like(t) for t in prealloc])

        def torch_load() -> Any:
            with socket.create_connection(("127.0.0.1", save_port)) as s, s.makefile("rb") as f:
                data = f.read()
            return torch.load(io.BytesIO(data), weights_only=True)

        ours = (os.getpid(), proc.pid or 0)  # this receiver, the serving child
        configs: list[Config] = [
            (BASELINE, lambda: recv_raw(raw_port, prealloc), ours),
            (FRESH, fresh, ours),
        ]
        if not args.no_save:
            configs.append(("torch.save/load via socket", torch_load, ours))
        chunk_list = [int(c) for c in args.chunks.split(",") if c.strip()]
        default_row = "HTTPTransport default"
        for chunks in [None, *chunk_list]:
            for in_place in (False, True):
                holder: dict[str, Any] = {}  # in place: the state of its first heal
                t = HTTPTransport[dict[str, Any]](
                    TIMEOUT,
                    bind_host="127.0.0.1",
                    state_dict=(lambda h=holder: h.get("sd")) if in_place else None,  # type: ignore[misc]
                    **_chunks_kw(chunks),
                )
                transports.append(t)
                if in_place:
                    holder["sd"] = t.recv_checkpoint(0, url, STEP, TIMEOUT)
                name = "default" if chunks is None else f"num_chunks={chunks}"
                label = f"HTTPTransport {name}{', in place' if in_place else ''}"
                configs.append(
                    (label, functools.partial(t.recv_checkpoint, 0, url, STEP, TIMEOUT), ours)
                )
        for in_place in (False, True):
            dst: dict[str, Any] = {}
            pgt = PGTransport[dict[str, Any]](
                pg,
                TIMEOUT,
                torch.device("cpu"),
                state_dict=(lambda d=dst: d.get("sd")) if in_place else None,  # type: ignore[misc]
            )

            def pg_recv(pgt: PGTransport[dict[str, Any]] = pgt) -> Any:
                parent.send("pg")
                out = pgt.recv_checkpoint(0, "<n/a>", STEP, TIMEOUT)
                parent.recv()
                return out

            if in_place:
                dst["sd"] = pg_recv()
            configs.append((f"PGTransport gloo{', in place' if in_place else ''}", pg_recv, ours))
        if args.torchft_python:
            torchft = TorchftPair(args.torchft_python, args.mb)
            pair = torchft
            theirs = tuple(p.pid for p in pair.procs)
            configs += [
                ("torchft HTTPTransport num_chunks=0", lambda: pair.heal("http"), theirs),
                ("torchft PGTransport gloo", lambda: pair.heal("pg"), theirs),
                ("torchft PGTransport gloo, in place", lambda: pair.heal("pg in place"), theirs),
            ]
            torchft_note = f"torchft: measured in this run ({args.torchft_python})"
        else:
            torchft_note = (
                "torchft: not run (set TORCHFT_PYTHON or --torchft-python to a python with "
                "torchft installed to add its rows)"
            )
        samples, cpu = _rounds(configs, args.repeats, _T0 + 0.6 * args.budget_s)
        paired_rows = set(samples)
        for chunks, in_place in ((None, False), (None, True)):
            label = f"HTTPTransport default, new process{', in place' if in_place else ''}"
            samples[label] = _cold(url, chunks, args.mb, in_place, args.cold, soft_end)
        signal.alarm(0)  # measured: report before any teardown can stall
        _report(samples, cpu, paired_rows, nbytes, args.budget_s, default_row, torchft_note)
        parent.send("stop")
        proc.join(3)
    finally:
        for t in transports:
            t.shutdown()
        if torchft is not None:
            torchft.stop()
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, 9)
            proc.join(5)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--torchft-peer":
        torchft_peer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
