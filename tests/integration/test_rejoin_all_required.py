"""A restarted group rejoins when the job needs every group (``min_replica_size``
equal to the number of groups).

Each step a restarted group heals into, it contributes nothing; counting only
contributors against ``min_replica_size`` made every group vote no, the healed
state was dropped and the next step healed again, for ever. Ranks run as
threads of this process (as torchft's own integration test runs them), each
replica group on its own TCPStore, against a real lighthouse; one group
"crashes" (every rank shuts its Manager down) at step 2 and is started again
as a new incarnation. Its first commit must come within a few steps, and
every group must end with the same model.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from tests.threads import run_in_threads
from torchft_pg import DistributedDataParallel, OptimizerWrapper, ProcessGroupGloo
from torchft_pg.manager import Manager

STEPS = 6
CRASH_AT = 2
TIMEOUT = timedelta(seconds=30)
MAX_ITERATIONS = 60  # bounds every loop: a livelock fails here instead of hanging


class Crash(Exception):
    pass


def run_rank(
    lighthouse: str,
    store: TCPStore,
    replica: int,
    rank: int,
    ranks: int,
    groups: int,
    use_async_quorum: bool,
    crash: threading.Event | None,
) -> dict[str, Any]:
    """One rank of a group until its committed step reaches STEPS, or until it
    'crashes' at CRASH_AT (when `crash` is given: every rank of the group does)."""
    manager = Manager(
        ProcessGroupGloo(timeout=TIMEOUT),
        min_replica_size=groups,
        use_async_quorum=use_async_quorum,
        rank=rank,
        world_size=ranks,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{replica}",
        timeout=TIMEOUT,
        quorum_timeout=TIMEOUT,
        connect_timeout=TIMEOUT,
    )
    torch.manual_seed(replica)  # groups start apart: only heals make them equal
    model = torch.nn.Linear(4, 3)
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def load(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager.set_state_dict_fns(
        load, lambda: {"model": model.state_dict(), "optim": inner.state_dict()}
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner)
    iterations = 0
    first_commit: int | None = None
    try:
        while manager.current_step() < STEPS and iterations < MAX_ITERATIONS:
            if crash is not None and manager.current_step() == CRASH_AT:
                crash.set()
                raise Crash(f"group {replica} rank {rank} crashes at step {CRASH_AT}")
            iterations += 1
            optimizer.zero_grad()
            step = manager.current_step()
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 * step + rank))
            ddp(x).pow(2).mean().backward()
            optimizer.step()
            if manager.current_step() > step and first_commit is None:
                first_commit = iterations
        return {
            "step": manager.current_step(),
            "iterations": iterations,
            "first_commit": first_commit,
            "params": [p.detach().clone() for p in model.parameters()],
        }
    finally:
        manager.shutdown(wait=False)


def new_store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("use_async_quorum", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize(("groups", "ranks"), [(2, 1), (2, 2), (3, 1)])
def test_a_restarted_group_rejoins_when_every_group_is_required(
    groups: int, ranks: int, use_async_quorum: bool
) -> None:
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=groups, join_timeout_ms=60_000, http_bind=None
    )
    stores = [new_store() for _ in range(groups)]
    crash = threading.Event()
    last = groups - 1
    results: dict[tuple[int, int], Any] = {}
    errors: list[BaseException] = []

    def rank_fn(replica: int, rank: int, store: TCPStore, crashes: bool) -> None:
        try:
            results[(replica, rank)] = run_rank(
                lighthouse.address(),
                store,
                replica,
                rank,
                ranks,
                groups,
                use_async_quorum,
                crash if crashes else None,
            )
        except Crash:
            pass
        except BaseException as e:
            errors.append(e)

    try:
        threads = [
            threading.Thread(target=rank_fn, args=(g, r, stores[g], g == last), daemon=True)
            for g in range(groups)
            for r in range(ranks)
        ]
        for t in threads:
            t.start()
        for t in threads[last * ranks :]:  # the crashing group's ranks end first
            t.join(timeout=120)
        assert crash.is_set() and not errors, errors
        # Started again as a new incarnation, on a fresh store, from its own initial state.
        restarted = new_store()
        run_in_threads(
            [
                (lambda r=r: rank_fn(last, r, restarted, False))  # type: ignore[misc]
                for r in range(ranks)
            ],
            timeout_s=240,
        )
        for t in threads[: last * ranks]:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a rank did not finish"
    finally:
        lighthouse.shutdown()
    assert not errors, errors
    assert sorted(results) == [(g, r) for g in range(groups) for r in range(ranks)]
    for key, res in results.items():
        assert res["step"] == STEPS, f"group/rank {key} stopped at step {res['step']}"
    for r in range(ranks):
        # the restarted group committed within a few steps of starting again
        first = results[(last, r)]["first_commit"]
        assert first is not None and first <= 3, f"rank {r}: first commit at iteration {first}"
        for g in range(groups - 1):
            for a, b in zip(results[(g, r)]["params"], results[(last, r)]["params"], strict=True):
                assert torch.equal(a, b), f"group {g} and the restarted group differ at rank {r}"
