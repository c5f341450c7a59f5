"""Test and benchmark helpers that run real processes (shipped so tests and
``bench/quorum.py`` share one implementation; nothing here imports torch).

``python -m lighthouse.testing replica ...`` runs a one-rank replica group: a
``ManagerServer`` plus a loop of ``ManagerClient.quorum`` calls, printing one
JSON line per quorum (``t`` is ``time.monotonic()``, comparable across processes
on Linux). ``python -m lighthouse.testing client ...`` runs a bare
``LighthouseClient`` loop and prints its timings as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import timedelta

from lighthouse import services, wire
from lighthouse._grpc import grpc
from lighthouse._net import CHANNEL_OPTIONS, normalize_address, stub
from lighthouse.coordinator.client import LighthouseClient
from lighthouse.errors import FaultToleranceError
from lighthouse.replica.client import ManagerClient
from lighthouse.replica.server import ManagerServer
from lighthouse.types import ManagerQuorumRequest, QuorumMember


def run_replica(args: argparse.Namespace) -> int:
    """One replica group of one rank; stops after ``--rounds`` quorums."""
    server = ManagerServer(
        args.replica_id,
        args.lighthouse,
        bind="127.0.0.1:0",
        store_addr="127.0.0.1:1",
        world_size=1,
        connect_timeout=timedelta(seconds=10),
    )
    client = ManagerClient(server.address())
    notices: list[list[str]] = []
    sub = client.subscribe_failures(lambda n: notices.append(list(n.dead_replica_ids)))
    sub.wait_ready(timedelta(seconds=5))
    print(json.dumps({"event": "ready", "address": server.address()}), flush=True)
    step = 0
    try:
        for _ in range(args.rounds):
            try:
                r = client.quorum(
                    ManagerQuorumRequest(
                        group_rank=0,
                        step=step,
                        checkpoint_metadata="",
                        timeout=timedelta(seconds=args.timeout_s),
                        init_sync=False,
                    )
                )
            except FaultToleranceError as exc:
                print(
                    json.dumps({"event": "error", "t": time.monotonic(), "error": str(exc)}),
                    flush=True,
                )
                continue
            print(
                json.dumps(
                    {
                        "event": "quorum",
                        "t": time.monotonic(),
                        "quorum_id": r.quorum_id,
                        "epoch": r.epoch,
                        "size": r.replica_world_size,
                        "notices": len(notices),
                    }
                ),
                flush=True,
            )
            step += 1
            if args.step_ms > 0:
                time.sleep(args.step_ms / 1000)  # simulated training step
    finally:
        sub.cancel()
        server.shutdown()
    return 0


async def _stream_client(args: argparse.Namespace) -> tuple[float, float]:
    """Like ``run_client`` over one persistent QuorumStream (as manager servers do)."""
    channel = grpc.aio.insecure_channel(args.lighthouse, options=CHANNEL_OPTIONS)
    call = stub(channel, services.LIGHTHOUSE_QUORUM_STREAM)()
    req = wire.encode_lighthouse_quorum_request(QuorumMember(args.replica_id))

    async def one() -> None:
        await call.write(req)
        wire.decode_lighthouse_quorum_response(await asyncio.wait_for(call.read(), args.timeout_s))

    for _ in range(args.warmup):
        await one()
    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(args.rounds):
        await one()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    call.cancel()
    await channel.close()
    return elapsed, cpu


def run_client(args: argparse.Namespace) -> int:
    """A bare lighthouse client: ``--warmup`` then ``--rounds`` timed quorums."""
    if args.stream:
        from lighthouse._loop import _new_loop

        loop = _new_loop()
        try:
            elapsed, cpu = loop.run_until_complete(_stream_client(args))
        finally:
            loop.close()
    else:
        client = LighthouseClient(args.lighthouse, connect_timeout=timedelta(seconds=10))
        timeout = timedelta(seconds=args.timeout_s)
        for _ in range(args.warmup):
            client.quorum(args.replica_id, timeout)
        start, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(args.rounds):
            client.quorum(args.replica_id, timeout)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    print(
        json.dumps(
            {
                "replica_id": args.replica_id,
                "rounds": args.rounds,
                "elapsed_s": elapsed,
                "cpu_s": cpu,
            }
        ),
        flush=True,
    )
    return 0


async def _sim(addr: str, n: int, rounds: int, stream: bool) -> list[float]:
    """``n`` replicas in this process: one persistent QuorumStream each (as manager
    servers do) if ``stream``, else one unary call per replica per round."""
    channels = [grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS) for _ in range(4)]
    unary = [stub(c, services.LIGHTHOUSE_QUORUM) for c in channels]
    streams = (
        [stub(channels[i % 4], services.LIGHTHOUSE_QUORUM_STREAM)() for i in range(n)]
        if stream
        else []
    )
    reqs = [
        wire.encode_lighthouse_quorum_request(
            QuorumMember(
                f"sim{i:05d}",
                address=f"127.0.0.1:{20000 + i}",
                store_address=f"127.0.0.1:{30000 + i}",
                step=7,
                world_size=8,
            )
        )
        for i in range(n)
    ]

    async def ask(i: int) -> bytes:
        if not stream:
            return await unary[i % 4](reqs[i], timeout=60)  # type: ignore[no-any-return]
        await streams[i].write(reqs[i])
        return await streams[i].read()  # type: ignore[no-any-return]

    times = []
    try:
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            replies = await asyncio.wait_for(asyncio.gather(*(ask(i) for i in range(n))), 60)
            times.append(time.perf_counter() - t0)
            _, _, size = wire.peek_quorum_id(replies[r % n])
            assert size == n, f"quorum of {size}, expected {n}"
    finally:
        for st in streams:
            st.cancel()
        for c in channels:
            await c.close()
    return times[1:]  # the first round includes channel set-up


def run_sim(args: argparse.Namespace) -> int:
    """Print the median round time (seconds) of ``-n`` simulated replicas as JSON."""
    import statistics

    from lighthouse._loop import _new_loop

    loop = _new_loop()
    try:
        times = loop.run_until_complete(_sim(args.lighthouse, args.n, args.rounds, args.stream))
    finally:
        loop.close()
    print(json.dumps({"n": args.n, "median_round_s": statistics.median(times)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lighthouse.testing")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replica", help="a one-rank replica group looping over quorums")
    r.add_argument(
        "--lighthouse", required=True, type=normalize_address, help="host:port or http://host:port"
    )
    r.add_argument("--replica-id", required=True)
    r.add_argument("--rounds", type=int, default=1000)
    r.add_argument("--step-ms", type=float, default=20.0, help="simulated step, milliseconds")
    r.add_argument("--timeout-s", type=float, default=10.0, help="quorum timeout, seconds")
    c = sub.add_parser("client", help="a bare LighthouseClient timing quorum rounds")
    c.add_argument(
        "--lighthouse", required=True, type=normalize_address, help="host:port or http://host:port"
    )
    c.add_argument("--replica-id", required=True)
    c.add_argument("--warmup", type=int, default=20)
    c.add_argument("--rounds", type=int, default=200)
    c.add_argument("--timeout-s", type=float, default=30.0, help="quorum timeout, seconds")
    c.add_argument("--stream", action="store_true", help="use a persistent QuorumStream (asyncio)")
    m = sub.add_parser("sim", help="many simulated replicas in one process")
    m.add_argument(
        "--lighthouse", required=True, type=normalize_address, help="host:port or http://host:port"
    )
    m.add_argument("-n", type=int, required=True)
    m.add_argument("--rounds", type=int, default=5)
    m.add_argument("--stream", action="store_true")
    args = p.parse_args(argv)
    runners = {"replica": run_replica, "client": run_client, "sim": run_sim}
    return runners[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
