"""Run a function on N real processes that meet at a real TCPStore on 127.0.0.1.

Processes come from a forkserver that has already imported torch, so each
rank starts in tens of milliseconds instead of seconds. Every process is
joined with a deadline and killed by its own pid if it overstays, also when
the test fails.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "torchft_pg"])


@dataclass
class RankContext:
    """What a rank function gets: its rank, the world and the coordination store."""

    rank: int
    world_size: int
    store_port: int
    args: tuple[Any, ...] = ()
    _store: TCPStore | None = field(default=None, repr=False)

    def addr(self, prefix: str) -> str:
        """A `host:port/prefix` store address on the test's TCPStore."""
        return f"127.0.0.1:{self.store_port}/{prefix}"

    @property
    def store(self) -> TCPStore:
        """A client of the test's TCPStore, for barriers between ranks."""
        if self._store is None:
            self._store = TCPStore(
                "127.0.0.1",
                self.store_port,
                is_master=False,
                timeout=timedelta(seconds=60),
                wait_for_workers=False,
            )
        return self._store

    def barrier(self, name: str, members: list[int] | None = None) -> None:
        """Wait until every rank in `members` (default: all) reached barrier `name`."""
        members = list(range(self.world_size)) if members is None else members
        self.store.set(f"barrier/{name}/{self.rank}", "1")
        self.store.wait([f"barrier/{name}/{r}" for r in members])


def _child(fn: Callable[[RankContext], Any], ctx: RankContext, conn: Any) -> None:
    try:
        result: Any = ("ok", fn(ctx))
    except BaseException as e:  # report everything, including SystemExit
        result = ("error", f"rank {ctx.rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    try:
        conn.send(result)
    finally:
        conn.close()


class RankFailed(AssertionError):
    pass


@contextmanager
def store_server() -> Iterator[TCPStore]:
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    try:
        yield store
    finally:
        del store


def run_ranks(
    fn: Callable[[RankContext], Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    allow_exit: set[int] | None = None,
) -> list[Any]:
    """Run `fn(ctx)` on `world_size` processes and return their results by rank.

    A rank that raises fails the call with its traceback. Ranks in
    `allow_exit` may die without a result (their entry is None).
    `timeout` (s) bounds the whole run; stragglers are killed by pid.
    """
    allow_exit = allow_exit or set()
    with store_server() as store:
        procs = []
        for rank in range(world_size):
            parent_conn, child_conn = _CTX.Pipe(duplex=False)
            ctx = RankContext(rank, world_size, store.port, args)
            p = _CTX.Process(target=_child, args=(fn, ctx, child_conn), daemon=True)
            p.start()
            child_conn.close()
            procs.append((p, parent_conn))
        try:
            results: list[Any] = []
            errors: list[str] = []
            deadline = time.monotonic() + timeout
            for rank, (p, conn) in enumerate(procs):
                if conn.poll(max(0.0, deadline - time.monotonic())):
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "died", None
                else:
                    status, value = "timeout", None
                if status == "ok":
                    results.append(value)
                elif status == "error":
                    errors.append(value)
                    results.append(None)
                elif rank in allow_exit:
                    results.append(None)
                else:
                    errors.append(f"rank {rank}: {status} (exit code {p.exitcode})")
                    results.append(None)
            if errors:
                raise RankFailed("\n".join(errors))
            return results
        finally:
            for p, conn in procs:
                p.join(timeout=5)
                if p.is_alive() and p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.join(timeout=5)
                conn.close()
