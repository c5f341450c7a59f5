"""Small probes the network-namespace tests run inside a host's namespace.

``python -m tests.chaos.netns_probe store HOST PORT``: serve a TCPStore on
HOST:PORT, print ``up``, and serve until stdin closes.

``python -m tests.chaos.netns_probe configure HOST STORE_ADDR RANK WORLD TIMEOUT_S``:
build a `ProcessGroupGloo` bound to HOST, print ``ready``, wait for a line on
stdin, then `configure` it at STORE_ADDR (``host:port/prefix``) and print one
JSON line: the seconds configure took and its error (null if it succeeded).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta


def main(argv: list[str]) -> int:
    from torch.distributed import TCPStore

    from torchft_pg.process_group import ProcessGroupGloo

    if argv[0] == "store":
        store = TCPStore(argv[1], int(argv[2]), is_master=True, wait_for_workers=False)
        print("up", flush=True)
        sys.stdin.read()  # until the test closes our stdin (or kills us)
        del store
        return 0
    if argv[0] == "configure":
        host, addr, rank, world, timeout_s = argv[1:6]
        pg = ProcessGroupGloo(timedelta(seconds=float(timeout_s)), hostname=host)
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.monotonic()
        error = None
        try:
            pg.configure(addr, int(rank), int(world))
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        elapsed = time.monotonic() - start
        print(json.dumps({"elapsed_s": elapsed, "error": error}), flush=True)
        pg.shutdown()
        return 0
    raise SystemExit(f"unknown probe {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
