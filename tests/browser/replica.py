"""A one-rank replica group for the dashboard test (torch-free, starts in about a second).

``python -m tests.browser.replica --lighthouse ADDR --replica-id ID --step-ms MS``
runs a ``ManagerServer`` and loops over quorum rounds like
``python -m lighthouse.testing replica``, with three differences the dashboard
needs: each request reports the previous step's duration (``step_time_ms``)
and its own work in it (``busy_ms``: the simulated step, without the wait for
the quorum, which is where a fast group waits for a slow one), and a result
that says ``heal`` jumps to the quorum's step, as a Manager does once it has
loaded a peer's state, and reports that heal with its next request as a
Manager does (``--heal-bytes`` bytes in ``--heal-s`` seconds: simulated, no
state moves; ``tests/integration/test_lh_heal_report.py`` moves a real one).
With ``--then-step-ms MS`` a SIGUSR1 changes the simulated step to MS from the
next round on (a straggler that keeps pace again), announced by a
``step_ms`` line. One JSON line per round on stdout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from datetime import timedelta

from lighthouse._net import normalize_address
from lighthouse.errors import FaultToleranceError
from lighthouse.replica.client import ManagerClient
from lighthouse.replica.server import ManagerServer
from lighthouse.types import HealReport, ManagerQuorumRequest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.browser.replica")
    p.add_argument("--lighthouse", required=True, type=normalize_address)
    p.add_argument("--replica-id", required=True)
    p.add_argument("--step-ms", type=float, default=50.0, help="simulated step, milliseconds")
    p.add_argument(
        "--then-step-ms", type=float, default=None, help="the simulated step after a SIGUSR1"
    )
    p.add_argument("--rounds", type=int, default=100_000)
    p.add_argument("--timeout-s", type=float, default=10.0, help="quorum timeout, seconds")
    p.add_argument("--heal-bytes", type=int, default=1_234_567_890, help="a simulated heal's bytes")
    p.add_argument("--heal-s", type=float, default=0.42, help="a simulated heal's seconds")
    args = p.parse_args(argv)
    server = ManagerServer(
        args.replica_id,
        args.lighthouse,
        bind="127.0.0.1:0",
        store_addr="127.0.0.1:1",
        world_size=1,
        connect_timeout=timedelta(seconds=10),
    )
    client = ManagerClient(server.address())
    step_ms = args.step_ms
    switch = {"asked": False}  # set by SIGUSR1 (only when --then-step-ms is given)
    if args.then_step_ms is not None:
        signal.signal(signal.SIGUSR1, lambda *_: switch.update(asked=True))
    print(json.dumps({"event": "ready", "address": server.address()}), flush=True)
    step = 0
    step_time_ms = busy_ms = 0.0
    heal: HealReport | None = None  # reported with the next request, once
    try:
        for _ in range(args.rounds):
            started = time.monotonic()
            try:
                r = client.quorum(
                    ManagerQuorumRequest(
                        group_rank=0,
                        step=step,
                        checkpoint_metadata="",
                        timeout=timedelta(seconds=args.timeout_s),
                        init_sync=False,
                        step_time_ms=step_time_ms,
                        busy_ms=busy_ms,
                        heal=heal,
                    )
                )
                heal = None
            except FaultToleranceError as exc:
                print(json.dumps({"event": "error", "error": str(exc)}), flush=True)
                continue
            healed_from = step if r.heal else None
            if r.heal:
                step = r.max_step  # as if the peer's state had been loaded
                heal = HealReport(step=step, bytes_received=args.heal_bytes, transfer_s=args.heal_s)
            print(
                json.dumps(
                    {
                        "event": "quorum",
                        "quorum_id": r.quorum_id,
                        "size": r.replica_world_size,
                        "step": step,
                        "healed_from": healed_from,
                    }
                ),
                flush=True,
            )
            if switch["asked"] and step_ms != args.then_step_ms:
                step_ms = args.then_step_ms
                print(
                    json.dumps({"event": "step_ms", "step_ms": step_ms, "step": step}), flush=True
                )
            working = time.monotonic()
            time.sleep(step_ms / 1000)  # the simulated training step itself
            step += 1
            done = time.monotonic()
            step_time_ms = (done - started) * 1000
            busy_ms = min((done - working) * 1000, step_time_ms)
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
