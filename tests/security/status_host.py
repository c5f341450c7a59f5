"""A lighthouse status server in a process of its own that can run itself out of
file descriptors, for the test of its accept loop.

``python -m tests.security.status_host`` serves a ``StatusHTTPServer`` on
127.0.0.1 (``/status`` answers ``{"ok": true}``), logs to stderr and prints
``{"port": n}``. Then it reads commands from stdin, one a line, and answers each
with a JSON line: ``hog`` opens ``/dev/null`` until the open-file limit is
reached (``{"hogged": n}``), ``release`` closes them again (``{"released": n}``).
It stops when stdin closes. Nothing here imports grpc or torch.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from lighthouse.coordinator.status import LighthouseMetrics, StatusHTTPServer


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    server = StatusHTTPServer(("127.0.0.1", 0), lambda: {"ok": True}, LighthouseMetrics())
    print(json.dumps({"port": server.port}), flush=True)
    hogged: list[int] = []
    try:
        for line in sys.stdin:
            if line.strip() == "hog":
                for _ in range(1 << 20):  # bounded: the limit ends it long before
                    try:
                        hogged.append(os.open(os.devnull, os.O_RDONLY))
                    except OSError:
                        break
                print(json.dumps({"hogged": len(hogged)}), flush=True)
            elif line.strip() == "release":
                for fd in hogged:
                    os.close(fd)
                print(json.dumps({"released": len(hogged)}), flush=True)
                hogged.clear()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
