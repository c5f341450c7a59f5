"""ExactlyOnceBatchSampler over real Managers (ranks as threads, a real lighthouse,
real gRPC, TCPStore and Gloo): one group fails a step after its collective and
heals while the other commits it, so the participants change mid-epoch, and the
samples of the committed steps cover the stream once."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
import torch
from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupGloo
from torchft_pg.data import ExactlyOnceBatchSampler
from torchft_pg.data_plan import DataPlan
from torchft_pg.manager import Manager

pytestmark = pytest.mark.timeout(120)

SIZE = 50  # samples: the run covers more than one epoch
STEPS = {"a": 40, "b": 40}  # committed steps each group runs to
FAIL_AT = {"b": 5}  # b's 5th attempt reports an error after its collective: b heals


def test_committed_steps_use_every_sample_once_while_a_group_joins_fails_and_heals() -> None:
    plan = DataPlan(dataset_size=SIZE, group_world_size=1, batch_size=3, shuffle=True, seed=5)
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, http_bind=None
    )

    def group(name: str) -> list[tuple[int, list[int], bool]]:
        """(the step it drew for, its indices, committed) for every attempt."""
        out = []
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        timeout = timedelta(seconds=20)
        manager = Manager(  # one rank per group; real collectives keep the groups in step
            ProcessGroupGloo(timeout=timeout),
            min_replica_size=1,
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lighthouse.address(),
            replica_id=name,
            timeout=timeout,
            quorum_timeout=timeout,
            load_state_dict=lambda _: None,
            state_dict=lambda: {},
        )
        try:
            sampler = ExactlyOnceBatchSampler(plan, manager, group_rank=0)
            for attempt in range(STEPS[name] * 3):  # bounded: failed attempts add a few
                manager.start_quorum()
                indices = sampler.step_indices()
                step = manager.current_step()  # after the quorum: healed if it healed
                manager.allreduce(torch.ones(1)).wait()
                if FAIL_AT.get(name) == attempt:
                    manager.report_error(RuntimeError("injected: this group's step fails"))
                participating = manager.participating_rank() is not None
                committed = manager.should_commit()
                if participating:  # a group healing into the step draws nothing
                    out.append((step, indices, committed))
                if manager.current_step() >= STEPS[name]:
                    break
        finally:
            manager.shutdown(wait=False)
        return out

    try:
        runs = run_in_threads([lambda: group("a"), lambda: group("b")], timeout_s=110)
    finally:
        lighthouse.shutdown()
    # A step is committed if a group committed it. Its samples are each participant's
    # last attempt at that step: an attempt nobody committed was drawn again; one
    # this group discarded while another committed it (its collective ran) counts.
    committed_steps = {step for run in runs for step, _, committed in run if committed}
    by_step: dict[int, list[int]] = {}
    for run in runs:
        last = {step: indices for step, indices, _ in run}
        for step, indices in last.items():
            if step in committed_steps:
                by_step.setdefault(step, []).extend(indices)
    assert any(not c for _, _, c in runs[1]), "b's injected failure did not fail a step"
    assert sorted(committed_steps) == list(range(STEPS["a"]))
    used = [i for step in sorted(by_step) for i in by_step[step]]
    epochs = len(used) // SIZE
    assert epochs >= 2, len(used)
    for e in range(epochs):
        assert Counter(used[e * SIZE : (e + 1) * SIZE]) == Counter(range(SIZE)), e
    tail = used[epochs * SIZE :]
    assert len(tail) == len(set(tail))  # the unfinished epoch: no sample twice so far
