"""A manager server in a process of its own, for tests that load it from outside.

``python -m tests.security.manager_host --lighthouse ADDR --replica-id ID
[--unauthenticated-timeout-ms MS]`` starts a ``ManagerServer`` (one rank, on
127.0.0.1, the job secret from ``TORCHFT_JOB_SECRET`` if set), prints one JSON
line ``{"address": "host:port", "pid": n}`` once its liveness stream to the
lighthouse is open, logs to stderr, and serves until its stdin closes or it
is signalled. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import timedelta

from lighthouse import ManagerServer


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.security.manager_host")
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--replica-id", required=True)
    p.add_argument("--unauthenticated-timeout-ms", type=int, default=10_000)
    a = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    ms = ManagerServer(
        a.replica_id,
        a.lighthouse,
        bind="127.0.0.1:0",
        store_addr="127.0.0.1:4000",
        unauthenticated_timeout=timedelta(milliseconds=a.unauthenticated_timeout_ms),
    )
    try:
        if not ms.wait_liveness(timedelta(seconds=30)):
            raise SystemExit("no liveness stream to the lighthouse within 30 s")
        print(json.dumps({"address": ms.address(), "pid": os.getpid()}), flush=True)
        sys.stdin.read()  # until the test closes our stdin
    finally:
        ms.shutdown()


if __name__ == "__main__":
    main()
