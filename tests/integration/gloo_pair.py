"""Two configured members of one Gloo group, as ranks of this process."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from tests.multiproc import store_server
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupGloo


@contextmanager
def gloo_pair(prefix: str, timeout: timedelta) -> Iterator[list[ProcessGroupGloo]]:
    """Two members of one Gloo group (each op bounded by `timeout`), configured on a
    fresh store under `prefix`; aborted (in-flight ops fail) and shut down afterwards."""
    with store_server() as store:
        pgs = [ProcessGroupGloo(timeout=timeout) for _ in range(2)]
        addr = f"127.0.0.1:{store.port}/{prefix}"

        def configure(rank: int) -> None:
            pgs[rank].configure(addr, rank, 2)

        run_in_threads([functools.partial(configure, r) for r in range(2)])
        try:
            yield pgs
        finally:
            for pg in pgs:
                pg.abort()
                pg.shutdown()
