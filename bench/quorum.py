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
4. Lighthouse server CPU per unary call: each server in a process of its own,
   one client process making 2000 sequential heartbeats; the server process's
   CPU over those calls (all its threads, /proc/PID/task/*/schedstat) per call
   (``server_cpu_per_call``): ours, and an empty grpc.aio server answering one
   unary method with empty bytes (the floor of a Python gRPC server), then, once
   each, gRPC's documented ``GRPC_POLL_STRATEGY=poll`` and default engines
   (``GRPC_EXPERIMENTS=""``; ours turns two engines off), asyncio's loop in
   place of uvloop, and an empty sync ``grpc.server``.
5. Lighthouse server CPU per liveness ping, the one message a lease holder
   sends per step: one client stream sending 2000 pings 2 ms apart to our
   lighthouse's Liveness method and to an empty grpc.aio stream method that
   reads and drops them; the server's CPU per message net of its idle CPU
   (``server_cpu_per_ping``), and ours over the empty server's.

With ``--torchft-python PATH`` (or ``TORCHFT_PYTHON``), a python that has the real
torchft installed, torchft runs in the same run, all its processes started with
that python: at N = 2, 8, 16 its lighthouse (in a process of its own) and N
processes looping over its ``LighthouseClient.quorum`` with 1.'s timing
(``torchft_n*``), run between our ``real_n*`` and ``real_unary_n*`` at each N so
the machine's load weighs on all three, with ``real_unary_n*_vs_torchft`` and
``real_n*_vs_torchft`` = ours / torchft's (goal <= 1); and 4. for its lighthouse
(``torchft``, heartbeats from its client), with ``server_cpu_ours_vs_torchft``
(goal <= 2). 4.'s ours, torchft's and the empty server run twice, alternating;
the lower of the two is reported. ``--sections`` runs only some parts.

Prints a table and, last, one JSON line. Bounded: 1-2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._proc import process_cpu_s  # noqa: E402
from bench.manager_quorum import (  # noqa: E402
    TORCHFT_ENV,
    _without_our_tree,
    read_json_line,
    stop,
)

TARGETS_MS = {
    "real_n8": 1.5,
    "real_n16": 3.0,
    "sim_n8": 1.5,
    "sim_n16": 3.0,
    "sim_n512": 100.0,
    "kill_to_quorum": 500.0,
}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TORCHFT_NS = (2, 8, 16)  # the real-client N also run on torchft with --torchft-python
# server CPU per unary call: sequential heartbeats from one client process
HB_CALLS = 2000
HB_WARMUP = 200
IDLE_S = 0.3  # the server's idle CPU is measured over this long before the calls
EMPTY_SERVICE = "bench.Empty"  # the empty server's one method: /bench.Empty/Ping
# (row, server, environment added to the server's): ours, torchft's, the floor ...
SERVER_CPU_RUNS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("ours", "ours", {}),
    ("torchft", "torchft", {}),
    ("empty_aio", "empty_aio", {}),
)
SERVER_CPU_REPEATS = 2  # each of those, alternating; the lower of the two is reported
# ... and, once each, gRPC's documented knobs and the choice of loop and server API
KNOB_RUNS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("ours_poll", "ours", {"GRPC_POLL_STRATEGY": "poll"}),
    ("ours_grpc_default_engine", "ours", {"GRPC_EXPERIMENTS": ""}),
    ("ours_asyncio_loop", "ours", {"LIGHTHOUSE_NO_UVLOOP": "1"}),
    ("empty_aio_poll", "empty_aio", {"GRPC_POLL_STRATEGY": "poll"}),
    ("empty_aio_grpc_default_engine", "empty_aio", {"GRPC_EXPERIMENTS": ""}),
    ("empty_aio_asyncio_loop", "empty_aio", {"LIGHTHOUSE_NO_UVLOOP": "1"}),
    ("empty_sync", "empty_sync", {}),
)
SECTIONS = ("rounds", "sim", "kill", "server_cpu", "ping_cpu")
PINGS = 2000
PING_PERIOD_S = 0.002  # a 2 ms step: the pace of a short step's liveness pings
PING_WARMUP = 100
# (row, server): our lighthouse's liveness stream, and an empty grpc.aio stream method
PING_CPU_RUNS: tuple[tuple[str, str], ...] = (("ours", "ours"), ("empty_aio", "empty_aio"))


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lighthouse.testing", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
        cwd=ROOT,
    )


def _reports(outs: list[str]) -> list[dict[str, Any]]:
    """Each client's last stdout line, a JSON report; RuntimeError if any printed none
    (a client whose quorum timed out exits with a traceback on stderr)."""
    lines = [o.strip().splitlines() for o in outs]
    missing = sum(1 for ls in lines if not ls or not ls[-1].startswith("{"))
    if missing:
        raise RuntimeError(f"{missing} of {len(outs)} clients printed no result")
    return [json.loads(ls[-1]) for ls in lines]


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
    from lighthouse import LighthouseServer

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
        reports = _reports([p.communicate(timeout=60)[0] for p in procs])
        per_round = [r["elapsed_s"] / rounds for r in reports]
        return statistics.median(per_round) * 1000, sum(r["cpu_s"] for r in reports) / rounds * 1000
    finally:
        _stop(procs)
        lh.shutdown()


def simulated(n: int, rounds: int, stream: bool) -> float:
    """Median per-round latency in ms for ``n`` replicas simulated in one client process."""
    from lighthouse import LighthouseServer

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
    from lighthouse import LighthouseServer

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


def _torchft_native() -> Any:
    """torchft's compiled module, ``torchft._torchft``, loaded by itself (child, torchft's
    python): the package's ``__init__`` imports torch, seconds per process on 2 cores,
    and ``torchft.coordination``'s lighthouse and client are this module's classes."""
    import importlib.machinery
    import importlib.util

    spec = importlib.util.find_spec("torchft")  # finds the package, runs nothing of it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torchft is not installed in this python")
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_torchft" + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader("torchft._torchft", path)
                native = importlib.util.module_from_spec(
                    importlib.util.spec_from_loader("torchft._torchft", loader)  # type: ignore[arg-type]
                )
                loader.exec_module(native)
                return native
    raise ImportError("torchft._torchft not found")


def torchft_lighthouse(n: int, join_timeout_ms: int) -> None:
    """Child, torchft's python: torchft's lighthouse on loopback; prints its address as
    one JSON line and serves until the parent closes our stdin."""
    lh = _torchft_native().LighthouseServer("127.0.0.1:0", n, join_timeout_ms)
    try:
        # its address() names the host, which need not resolve to loopback
        port = lh.address().rstrip("/").rsplit(":", 1)[1]
        print(json.dumps({"address": f"http://127.0.0.1:{port}"}), flush=True)
        sys.stdin.read()  # EOF: the parent is done
    finally:
        lh.shutdown()


def _start_torchft_lighthouse(
    python: str, n: int, join_timeout_ms: int
) -> tuple[subprocess.Popen[bytes], str]:
    """torchft's lighthouse in a process of ``python``; the process and its address."""
    lh = subprocess.Popen(
        [python, __file__, "--torchft-lighthouse", str(n), str(join_timeout_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=TORCHFT_ENV,
    )
    info = read_json_line(lh, timeout=60)
    if info is None:
        stop(lh)
        raise RuntimeError(f"torchft's lighthouse did not start (exit {lh.poll()})")
    return lh, str(info["address"])


def torchft_clients(n: int, rounds: int, python: str) -> tuple[float, float, float]:
    """``real_clients``' unary loop on torchft: its Rust lighthouse in a process of its
    own and ``n`` processes looping over its ``LighthouseClient.quorum``, all run by
    ``python``. Median ms per round, the clients' summed CPU ms per round (timed loop)
    and the lighthouse process's CPU ms per round (warm-up rounds included)."""
    lh, address = _start_torchft_lighthouse(python, n, 60_000)
    procs: list[subprocess.Popen[str]] = []
    try:
        cpu0 = process_cpu_s(lh.pid)
        procs = [
            subprocess.Popen(
                [python, __file__, "--torchft-client", address, f"r{i:03d}", "20", str(rounds)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=TORCHFT_ENV,
            )
            for i in range(n)
        ]
        reports = _reports([p.communicate(timeout=60)[0] for p in procs])
        server_ms = (process_cpu_s(lh.pid) - cpu0) / (rounds + 20) * 1000
        per_round = [r["elapsed_s"] / rounds for r in reports]
        clients_ms = sum(r["cpu_s"] for r in reports) / rounds * 1000
        return statistics.median(per_round) * 1000, clients_ms, server_ms
    finally:
        _stop(procs)
        stop(lh)


def torchft_client(address: str, replica_id: str, warmup: int, rounds: int) -> None:
    """Child, torchft's python: ``lighthouse.testing``'s unary client loop with
    torchft's ``LighthouseClient``; prints the same JSON line."""
    client = _torchft_native().LighthouseClient(address, timedelta(seconds=10))
    timeout = timedelta(seconds=30)
    for _ in range(warmup):
        client.quorum(replica_id, timeout)
    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        client.quorum(replica_id, timeout)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    line = {"replica_id": replica_id, "rounds": rounds, "elapsed_s": elapsed, "cpu_s": cpu}
    print(json.dumps(line), flush=True)


def serve(kind: str) -> None:
    """Child: a server on loopback (``ours``: our lighthouse; ``empty_aio`` /
    ``empty_sync``: a grpc.aio / grpc.server answering one unary method with empty
    bytes, the same gRPC settings as ours). Prints its address as one JSON line and
    serves until stdin closes."""
    if kind == "ours":
        from lighthouse import LighthouseServer

        lh = LighthouseServer(
            bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000, http_bind=None
        )
        try:
            print(json.dumps({"address": lh.address()}), flush=True)
            sys.stdin.read()  # EOF: the parent is done
        finally:
            lh.shutdown()
        return
    from lighthouse._grpc import grpc  # before grpc: the engine settings ours runs with

    def ping(request: bytes, context: object) -> bytes:
        return b""

    async def aping(request: bytes, context: object) -> bytes:
        return b""

    async def astream(requests: Any, context: object) -> Any:
        async for _ in requests:  # read every message, answer none (as a ping needs no answer)
            pass
        return
        yield b""  # an async generator: a stream of no responses

    methods = {"Ping": grpc.unary_unary_rpc_method_handler(ping if kind == "empty_sync" else aping)}
    if kind != "empty_sync":
        methods["Stream"] = grpc.stream_stream_rpc_method_handler(astream)
    handler = grpc.method_handlers_generic_handler(EMPTY_SERVICE, methods)
    if kind == "empty_sync":
        from concurrent.futures import ThreadPoolExecutor

        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            print(json.dumps({"address": f"127.0.0.1:{port}"}), flush=True)
            sys.stdin.read()
        finally:
            server.stop(None)
        return
    from lighthouse._loop import _new_loop  # uvloop, as our lighthouse's loop

    async def serve_aio() -> None:
        aio = grpc.aio.server()
        aio.add_generic_rpc_handlers((handler,))
        port = aio.add_insecure_port("127.0.0.1:0")
        await aio.start()
        print(json.dumps({"address": f"127.0.0.1:{port}"}), flush=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        finally:
            await aio.stop(None)

    loop = _new_loop()
    try:
        loop.run_until_complete(serve_aio())
    finally:
        loop.close()


def heartbeat_client(kind: str, address: str, calls: int) -> None:
    """Child: ``HB_WARMUP`` calls, a ``{"ready": true}`` line, then, once a line arrives
    on stdin, ``calls`` sequential calls timed; prints their wall and CPU seconds.
    ``ours``: our LighthouseClient.heartbeat; ``torchft``: torchft's (its python);
    else the empty server's method, sent our heartbeat request's bytes."""
    call: Callable[[], object]
    if kind == "torchft":
        tft = _torchft_native().LighthouseClient(address, timedelta(seconds=10))
        call = lambda: tft.heartbeat("hb0", timedelta(seconds=5))  # noqa: E731
    elif kind == "ours":
        from lighthouse.coordinator.client import LighthouseClient

        ours = LighthouseClient(address)
        call = lambda: ours.heartbeat("hb0")  # noqa: E731
    else:
        from lighthouse import wire
        from lighthouse._grpc import grpc

        channel = grpc.insecure_channel(address.removeprefix("http://"))
        method = channel.unary_unary(f"/{EMPTY_SERVICE}/Ping")
        request = wire.encode_heartbeat_request("hb0")
        call = lambda: method(request, timeout=5)  # noqa: E731
    for _ in range(HB_WARMUP):
        call()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    print(json.dumps({"elapsed_s": elapsed, "cpu_s": cpu}), flush=True)


def _start_server(kind: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """The server ``kind`` (``ours``, ``empty_aio``, ``empty_sync``) in a process of
    its own, ``env`` added to its environment, and the address it listens on."""
    srv = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**ENV, **env},
    )
    info = read_json_line(srv, timeout=60)
    if info is None:
        stop(srv)
        raise RuntimeError(f"server {kind} did not start (exit {srv.poll()})")
    return srv, str(info["address"])


def _server_cpu_under(
    srv: subprocess.Popen[bytes], client_cmd: list[str], client_env: dict[str, str], what: str
) -> tuple[float, float, dict[str, Any]]:
    """Start the client ``client_cmd``, wait for its ready line, read the server's
    idle CPU over ``IDLE_S``, then tell the client to go and read the server's CPU
    until the client's result line. (idle CPU seconds per second, CPU seconds used
    while the client ran, the client's result). Stops both processes."""
    cli: subprocess.Popen[bytes] | None = None
    try:
        cli = subprocess.Popen(
            client_cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=client_env,
        )
        if read_json_line(cli, timeout=60) is None:
            raise RuntimeError(f"the {what} did not start (exit {cli.poll()})")
        idle0, t0 = process_cpu_s(srv.pid), time.monotonic()
        time.sleep(IDLE_S)  # a measurement window, not a wait for anything
        idle = (process_cpu_s(srv.pid) - idle0) / (time.monotonic() - t0)
        cpu0 = process_cpu_s(srv.pid)
        assert cli.stdin is not None
        cli.stdin.write(b"go\n")
        cli.stdin.flush()
        done = read_json_line(cli, timeout=120)
        cpu = process_cpu_s(srv.pid) - cpu0
        if done is None:
            raise RuntimeError(f"the {what} did not finish (exit {cli.poll()})")
    finally:
        if cli is not None:
            stop(cli)
        stop(srv)
    return idle, cpu, done


def server_cpu(kind: str, env: dict[str, str], python: str | None) -> dict[str, float]:
    """The server ``kind`` (``ours``, ``torchft``, ``empty_aio``, ``empty_sync``) in a
    process of its own, ``env`` added to its environment; one client process makes
    ``HB_CALLS`` sequential unary calls (heartbeats). The server's CPU per call over
    the timed calls (µs), the call's wall time and the client's CPU per call (µs),
    and the server's idle CPU (µs per second, measured just before)."""
    if kind == "torchft":
        assert python is not None
        srv, address = _start_torchft_lighthouse(python, 2, 1000)
        client_cmd, client_env = [python, __file__, "--hb-client", kind], TORCHFT_ENV
    else:
        srv, address = _start_server(kind, env)
        client_cmd, client_env = [sys.executable, __file__, "--hb-client", kind], ENV
    idle, cpu, done = _server_cpu_under(
        srv, [*client_cmd, address, str(HB_CALLS)], client_env, f"{kind} heartbeat client"
    )
    return {
        "server_us": cpu / HB_CALLS * 1e6,
        "call_us": done["elapsed_s"] / HB_CALLS * 1e6,
        "client_us": done["cpu_s"] / HB_CALLS * 1e6,
        "idle_us_per_s": idle * 1e6,
    }


def ping_client(kind: str, address: str, pings: int) -> None:
    """Child: one client stream to the server (``ours``: our lighthouse's Liveness
    method, as a lease holder's manager server pings it once per round; else the
    empty server's stream method, sent the same bytes): ``PING_WARMUP`` pings, a
    ``{"ready": true}`` line, then, once a line arrives on stdin, ``pings`` pings
    ``PING_PERIOD_S`` apart (the pace is the measurement's, nothing waits on it),
    each reporting the next step; prints their wall seconds."""
    import queue
    import threading

    from lighthouse import services, wire
    from lighthouse._grpc import grpc

    channel = grpc.insecure_channel(address.removeprefix("http://"))
    path = services.LIGHTHOUSE_LIVENESS.path if kind == "ours" else f"/{EMPTY_SERVICE}/Stream"
    outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def requests() -> Any:
        while (item := outbox.get()) is not None:
            yield item

    call = channel.stream_stream(path)(requests())
    drained = threading.Thread(target=lambda: sum(1 for _ in call), daemon=True)
    drained.start()
    step = 0

    def ping() -> None:
        nonlocal step
        step += 1
        outbox.put(wire.encode_liveness_ping("ping0", step=step, step_time_ms=2.0, busy_ms=1.5))
        time.sleep(PING_PERIOD_S)

    for _ in range(PING_WARMUP):
        ping()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    for _ in range(pings):
        ping()
    elapsed = time.perf_counter() - start
    time.sleep(0.1)  # the last pings' handling falls inside the window (a pace, not a sync)
    print(json.dumps({"elapsed_s": time.perf_counter() - start, "pings_s": elapsed}), flush=True)
    outbox.put(None)
    channel.close()


def server_ping_cpu(kind: str) -> dict[str, float]:
    """The server ``kind`` (``ours``, ``empty_aio``) in a process of its own; one
    client process sends ``PINGS`` messages on one stream, ``PING_PERIOD_S`` apart.
    The server's CPU per message (µs) net of its idle CPU over the same time, and
    the idle CPU (µs per second, measured just before)."""
    srv, address = _start_server(kind, {})
    idle, cpu, done = _server_cpu_under(
        srv,
        [sys.executable, __file__, "--ping-client", kind, address, str(PINGS)],
        ENV,
        f"{kind} ping client",
    )
    net = cpu - idle * float(done["elapsed_s"])
    return {"server_us": net / PINGS * 1e6, "idle_us_per_s": idle * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--torchft-python",
        default=os.environ.get("TORCHFT_PYTHON"),
        metavar="PATH",
        help="a python with torchft installed: also run torchft in this run (env TORCHFT_PYTHON)",
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="parts to run: real-client rounds, simulated rounds, kill-to-quorum, "
        "server CPU per call",
    )
    args = parser.parse_args(argv)
    tft: str | None = args.torchft_python or None
    if tft and not (os.path.isfile(tft) and os.access(tft, os.X_OK)):
        parser.error(f"--torchft-python {tft}: not an executable file")
    sections = set(args.sections)

    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    t0 = time.monotonic()
    results: dict[str, float] = {}
    print(f"{'scenario':<34}{'ms/round':>10}{'target':>10}")
    cpu: dict[str, float] = {}
    errors: list[str] = []
    vs: dict[str, float] = {}
    for n, rounds in ((2, 400), (8, 200), (16, 150), (32, 80)) if "rounds" in sections else ():
        # ours and torchft's back to back at each N (torchft's between our two), so the
        # machine's load of the moment weighs on both
        for mode in ("stream", "torchft", "unary"):
            if mode == "torchft":
                if tft is None or n not in TORCHFT_NS:
                    continue
                try:
                    results[f"torchft_n{n}"], clients_ms, server_ms = torchft_clients(
                        n, rounds, tft
                    )
                except (RuntimeError, subprocess.SubprocessError, ValueError, OSError) as exc:
                    errors.append(f"torchft_n{n}: {type(exc).__name__}: {exc}"[:300])
                    continue
                cpu[f"torchft_n{n}_clients"], cpu[f"torchft_n{n}_server"] = clients_ms, server_ms
                continue
            key = f"real_n{n}" if mode == "stream" else f"real_unary_n{n}"
            server0 = _cpu_s()
            try:
                ms, cpu[f"{key}_clients"] = real_clients(n, rounds, stream=mode == "stream")
            except (RuntimeError, subprocess.SubprocessError) as exc:
                errors.append(f"{key}: {type(exc).__name__}: {exc}"[:300])
                continue
            results[key] = ms
            cpu[f"{key}_server"] = (_cpu_s() - server0) / (rounds + 20) * 1000  # + warm-up rounds
    for n in TORCHFT_NS:
        theirs = results.get(f"torchft_n{n}")
        for key in (f"real_unary_n{n}", f"real_n{n}"):
            if theirs and key in results:
                vs[f"{key}_vs_torchft"] = results[key] / theirs
    for n, rounds in ((8, 500), (16, 300)) if "sim" in sections else ():
        results[f"sim_n{n}"] = simulated(n, rounds, stream=True)
    for n, rounds in ((128, 20), (512, 8), (1024, 5)) if "sim" in sections else ():
        results[f"sim_n{n}"] = simulated(n, rounds, stream=True)
        results[f"sim_unary_n{n}"] = simulated(n, rounds, stream=False)
    if "kill" in sections:
        kill = kill_to_quorum()
        results["kill_to_quorum"] = kill["max_ms"]
    server: dict[str, dict[str, float]] = {}
    if "server_cpu" in sections:
        runs = [r for r in SERVER_CPU_RUNS if r[1] != "torchft" or tft is not None]
        for row, kind, env in [*runs * SERVER_CPU_REPEATS, *KNOB_RUNS]:
            try:
                got = server_cpu(kind, env, tft)
            except (RuntimeError, subprocess.SubprocessError, ValueError, OSError) as exc:
                errors.append(f"server_cpu {row}: {type(exc).__name__}: {exc}"[:300])
                continue
            if row not in server or got["server_us"] < server[row]["server_us"]:
                server[row] = got
    pings: dict[str, dict[str, float]] = {}
    if "ping_cpu" in sections:
        for row, kind in PING_CPU_RUNS * SERVER_CPU_REPEATS:
            try:
                got = server_ping_cpu(kind)
            except (RuntimeError, subprocess.SubprocessError, ValueError, OSError) as exc:
                errors.append(f"ping_cpu {row}: {type(exc).__name__}: {exc}"[:300])
                continue
            if row not in pings or got["server_us"] < pings[row]["server_us"]:
                pings[row] = got
    for key, value in results.items():
        target = TARGETS_MS.get(key)
        print(f"{key:<34}{value:>10.2f}{'' if target is None else f'{target:>10.1f}'}")
    ok = {k: results[k] <= v for k, v in TARGETS_MS.items() if k in results}
    if vs:
        print("ours / torchft, client-level quorum round (same run; goal <= 1):")
        for key, value in vs.items():
            print(f"  {key:<32}{value:>10.2f}")
    print("CPU ms per round: lighthouse process (incl. warm-up) / all clients (timed loop):")
    for key, value in cpu.items():
        print(f"  {key:<32}{value:>10.2f}")
    server_vs: float | None = None
    if server:
        print(
            f"lighthouse server CPU per unary call, {HB_CALLS} sequential heartbeats "
            "from one client process, server in a process of its own:"
        )
        print(f"  {'server':<32}{'server us':>10}{'call us':>10}{'client us':>10}{'idle us/s':>10}")
        for row, r in server.items():
            print(
                f"  {row:<32}{r['server_us']:>10.1f}{r['call_us']:>10.1f}"
                f"{r['client_us']:>10.1f}{r['idle_us_per_s']:>10.0f}"
            )
        if "ours" in server and "torchft" in server:
            server_vs = server["ours"]["server_us"] / server["torchft"]["server_us"]
            print(f"  ours / torchft server CPU per call: {server_vs:.2f} (goal <= 2)")
    ping_vs_empty: float | None = None
    if pings:
        print(
            f"lighthouse server CPU per liveness ping, {PINGS} pings on one stream "
            f"{PING_PERIOD_S * 1e3:.0f} ms apart, net of the server's idle CPU:"
        )
        print(f"  {'server':<32}{'server us':>10}{'idle us/s':>10}")
        for row, r in pings.items():
            print(f"  {row:<32}{r['server_us']:>10.1f}{r['idle_us_per_s']:>10.0f}")
        if "ours" in pings and "empty_aio" in pings:
            ping_vs_empty = pings["ours"]["server_us"] / pings["empty_aio"]["server_us"]
            print(f"  ours / an empty Python gRPC stream server: {ping_vs_empty:.2f}")
    for e in errors:
        print(f"error: {e}")
    if tft is None:
        print(
            "torchft not measured in this run: pass --torchft-python PATH or set "
            "TORCHFT_PYTHON to a python with torchft installed"
        )
    report: dict[str, Any] = {
        "bench": "quorum",
        "ms": {k: round(v, 3) for k, v in results.items()},
        "cpu_ms_per_round": {k: round(v, 3) for k, v in cpu.items()},
        "targets_ms": TARGETS_MS,
        "meets_target": ok,
    }
    if tft is not None:
        report["torchft"] = {"python": tft, "version": _torchft_version(tft)}
        report["vs_torchft"] = {k: round(v, 3) for k, v in vs.items()}
        report["vs_torchft_goal_met"] = {k: v <= 1.0 for k, v in vs.items()}
    if server:
        report["server_cpu_per_call"] = {
            row: {k: round(v, 2) for k, v in r.items()} for row, r in server.items()
        }
        report["heartbeat_calls"] = HB_CALLS
    if server_vs is not None:
        report["server_cpu_ours_vs_torchft"] = round(server_vs, 3)
        report["server_cpu_goal_met"] = server_vs <= 2.0
    if pings:
        report["server_cpu_per_ping"] = {
            row: {k: round(v, 2) for k, v in r.items()} for row, r in pings.items()
        }
    if ping_vs_empty is not None:
        report["ping_cpu_ours_vs_empty_server"] = round(ping_vs_empty, 3)
    report["errors"] = errors
    report["wall_s"] = round(time.monotonic() - t0, 1)
    report["cpus"] = os.cpu_count()
    print(json.dumps(report))
    return 0


def _torchft_version(python: str) -> str:
    """The torchft distribution ``python`` has installed, e.g. ``torchft-nightly X``."""
    code = (
        "from importlib import metadata\n"
        "for d in ('torchft-nightly', 'torchft'):\n"
        "    try:\n"
        "        print(d, metadata.version(d)); break\n"
        "    except metadata.PackageNotFoundError:\n"
        "        pass\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=30, env=TORCHFT_ENV
        )
    except (subprocess.SubprocessError, OSError):
        return "?"
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "--torchft-lighthouse":  # torchft's python
        _without_our_tree()
        torchft_lighthouse(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    if role == "--torchft-client":  # torchft's python
        _without_our_tree()
        torchft_client(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        sys.exit(0)
    if role == "--hb-client":
        if sys.argv[2] == "torchft":
            _without_our_tree()
        heartbeat_client(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.exit(0)
    if role == "--ping-client":
        ping_client(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.exit(0)
    if role == "--serve":
        serve(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
