"""torchft's side of `bench/collectives.py`, and what both sides share.

`bench/collectives.py --torchft-python PATH` runs this file with that python,
once per rank (``PATH bench/_collectives_torchft.py CONFIG_JSON``): two
processes that alternate raw torch Gloo, torchft's ``ProcessGroupGloo`` and
torchft's ``ProcessGroupBabyGloo`` op by op, exactly as our processes alternate
raw Gloo and ours (`interleaved_round`), on new groups every round, and print
one JSON line with each variant's median op time per round. Their rounds take
turns with ours (`Turns`): our round j, then theirs, then our round j + 1, so
a spell of load on the machine falls on both.

This file imports only the standard library and torch at its top level, and
torchft inside `worker`: torchft's BabyGloo starts its child with ``spawn``,
which runs this file again as the child's main module, and nothing of this
checkout may come in (its ``compat/torchft`` is another package of that name).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

TURN_TIMEOUT = timedelta(seconds=600)  # the other side's round, its groups' set-up included
SIDES = ("ours", "torchft")  # in this order within each round index


def interleaved_round(
    variants: dict[str, Callable[[Any], object]], t: Any, iters: int
) -> dict[str, float]:
    """One round's ops, the variants alternated op by op, taking them in each of
    their orders in turn (``iters`` rounded up to a whole number of passes over
    the orders); returns each variant's median op time in seconds.

    Every order in turn: a fixed order would make one variant always pay for the
    previous one's tail (a Baby child still running on one of two cores) or for
    the skew between the ranks after a barrier."""
    orders = list(itertools.permutations(variants.items()))
    iters = -(-iters // len(orders)) * len(orders)  # each order equally often
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(iters):
        for name, fn in orders[i % len(orders)]:
            start = time.perf_counter()
            fn(t)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


class Turns:
    """Rounds of our processes and torchft's take turns on one store: ours first at
    each round index, theirs next. A side's round ``j`` begins once every rank of
    the other side has finished the round before it in that order (torchft's set-up
    counting as the round before our first), so no round shares the machine with
    the other side's ops or group set-up."""

    def __init__(self, store: Any, side: str, rank: int, world_size: int) -> None:
        self.store = store
        self.side = side
        self.rank = rank
        self.world_size = world_size

    def _keys(self, side: str, what: str) -> list[str]:
        return [f"turn/{side}/{what}/{r}" for r in range(self.world_size)]

    def ready(self) -> None:
        self.store.set(f"turn/{self.side}/ready/{self.rank}", "1")

    def before(self, j: int) -> None:
        if self.side == "ours":
            keys = self._keys("torchft", "ready" if j == 0 else f"done/{j - 1}")
        else:
            keys = self._keys("ours", f"done/{j}")
        self.store.wait(keys, TURN_TIMEOUT)

    def after(self, j: int) -> None:
        self.store.set(f"turn/{self.side}/done/{j}/{self.rank}", "1")


def release(store: Any, side: str, rounds: int, world_size: int) -> None:
    """Set every key `side` would set, so the other side never waits on a side that
    has stopped (normally or not); the parent calls this once that side is over."""
    for r in range(world_size):
        store.set(f"turn/{side}/ready/{r}", "1")
        for j in range(rounds):
            store.set(f"turn/{side}/done/{j}/{r}", "1")


def _configure(pg: Any, store_addr: str, rank: int, world_size: int) -> None:
    """A new backend for torchft's group ``pg`` over the store prefix ``store_addr``."""
    try:
        from torchft.process_group import reconfigure_with_store
    except ImportError:  # releases before reconfigure handles: configure over the prefix
        pg.configure(store_addr, f"replica_{rank}", rank, world_size)
        return
    reconfigure_with_store(pg, store_addr, rank, world_size, timedelta(seconds=60))


def worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of torchft's side: per size, ``rounds`` rounds on new groups, each
    `interleaved_round` of raw Gloo, torchft Gloo and torchft BabyGloo, in turn with
    ours. Returns ``{variant: {size: [round medians, s]}}`` and torchft's version."""
    import torch
    import torch.distributed as dist
    import torchft
    from torch.distributed import AllreduceOptions, PrefixStore, TCPStore
    from torchft.process_group import ProcessGroupBabyGloo, ProcessGroupGloo

    if "torchft_pg" in sys.modules:  # a compatibility package over torchft_pg, not torchft
        raise RuntimeError(f"{torchft.__file__} is built on torchft_pg, not torchft's own")
    rank, world, port = cfg["rank"], cfg["world_size"], cfg["port"]
    sizes: dict[str, int] = cfg["sizes"]
    iters: dict[str, int] = cfg["iters"]
    rounds: int = cfg["rounds"]
    store = TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=TURN_TIMEOUT
    )
    turns = Turns(store, "torchft", rank, world)
    dist.init_process_group(
        "gloo",
        store=PrefixStore("torchft/raw", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    gloo = ProcessGroupGloo(timeout=timedelta(seconds=60))
    baby = ProcessGroupBabyGloo(timeout=timedelta(seconds=60))
    raw: list[Any] = []
    opts = AllreduceOptions()  # torch's default: a sum
    variants: dict[str, Callable[[Any], object]] = {
        "raw": lambda t: dist.all_reduce(t, group=raw[0]),
        "gloo": lambda t: gloo.allreduce([t], opts).wait(),
        "baby": lambda t: baby.allreduce([t], opts).wait(),
    }
    out: dict[str, dict[str, list[float]]] = {v: {s: [] for s in sizes} for v in variants}
    turns.ready()
    j = 0
    for size_name, nbytes in sizes.items():
        t = torch.ones(nbytes // 4)
        for r in range(rounds):
            turns.before(j)
            if raw:  # new groups of each kind, as ours get (see bench/collectives.py)
                dist.destroy_process_group(raw.pop())
            raw.append(dist.new_group(backend="gloo", timeout=timedelta(seconds=60)))
            _configure(gloo, f"127.0.0.1:{port}/torchft/gloo/{size_name}/{r}", rank, world)
            _configure(baby, f"127.0.0.1:{port}/torchft/baby/{size_name}/{r}", rank, world)
            for fn in variants.values():  # warm-up (the Baby tensor moves to shm)
                fn(t)
            barrier = [f"torchft/barrier/{size_name}/{r}/{p}" for p in range(world)]
            store.set(barrier[rank], "1")
            store.wait(barrier, timedelta(seconds=60))
            for name, med in interleaved_round(variants, t, iters[size_name]).items():
                out[name][size_name].append(med)
            turns.after(j)
            j += 1
    baby.shutdown()
    gloo.shutdown()
    dist.destroy_process_group()
    return {"rounds": out, "version": _version(), "module": os.path.dirname(torchft.__file__)}


def _version() -> str:
    from importlib import metadata

    for dist in ("torchft-nightly", "torchft"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            pass
    return "?"


def _without_our_tree() -> None:
    """Drop this checkout (and bench/) from sys.path: torchft's processes import
    torchft, nothing of ours; the spawn children of BabyGloo inherit this path."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = {here, os.path.dirname(here)}
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in ours]


if __name__ == "__main__":
    _without_our_tree()
    try:
        result: dict[str, Any] = worker(json.loads(sys.argv[1]))
    except Exception as exc:  # reported on stdout: the parent shows it and goes on with ours
        result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        traceback.print_exc()
    print(json.dumps(result), flush=True)
    sys.exit(1 if "error" in result else 0)
