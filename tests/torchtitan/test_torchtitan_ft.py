"""torchtitan's `experiments/torchft` modules, unchanged, on torchft_pg (see titan_worker).

2 replica groups x 2 ranks, FSDP2 inside each group over Gloo, the default
group of each created with ``_ranks`` (its global ranks) as torchtitan's
trainer creates it, a real lighthouse, real processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lighthouse import LighthouseServer
from tests.torchtitan.harness import GROUP_SIZE, Job, job, torchft_lighthouse
from tests.torchtitan.titan_worker import replay

pytestmark = pytest.mark.timeout(600)
GROUPS = 2


@pytest.fixture
def lighthouse_for_two() -> Iterator[LighthouseServer]:
    """Waits for both groups before the first quorum (min_replicas=2)."""
    server = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=60_000, http_bind=None
    )
    try:
        yield server
    finally:
        server.shutdown()


def steps_of(j: Job, count: int) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Wait for every rank's 'done' line; each rank's step lines by (replica, rank)."""
    done: set[tuple[int, int]] = set()
    while len(done) < count:
        e = j.wait_for(lambda e: e.get("event") == "done", "every rank to finish")
        done.add((e["replica"], e["rank"]))
        if e["full"] is not None:
            j.final[e["replica"]] = e["full"]
    j.wait_all_exit()
    out: dict[tuple[int, int], list[dict[str, Any]]] = {k: [] for k in done}
    for e in j.seen:
        if e.get("event") == "step":
            out[(e["replica"], e["rank"])].append(e)
    return out


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "nccl",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    GPUS < GROUPS * GROUP_SIZE,
                    reason=f"process_group='nccl' needs {GROUPS * GROUP_SIZE} CUDA devices "
                    f"(one per rank), this machine has {GPUS}",
                ),
            ],
        ),
    ],
)
def test_fault_free_hsdp_groups_end_bit_identical_and_the_loss_falls(
    lighthouse_for_two: LighthouseServer, backend: str
) -> None:
    with job(
        lighthouse_for_two.address(), "hsdp", GROUPS, ["--steps", "20", "--backend", backend]
    ) as j:
        for replica in range(GROUPS):
            j.start_group(replica)
        steps = steps_of(j, GROUPS * GROUP_SIZE)
    for rank in range(GROUP_SIZE):
        a, b = steps[(0, rank)], steps[(1, rank)]
        assert [s["committed"] for s in a] == list(range(1, 21))
        assert [s["digest"] for s in a] == [s["digest"] for s in b]
        assert [s["participants"] for s in a] == [1] + [GROUPS] * 19
    losses = [s["loss"] for s in steps[(0, 0)]]
    assert losses[-1] < 0.5 * losses[0], losses
    # The same 20 steps in one process, without FSDP or fault tolerance. At step 0
    # one group syncs from the other (init_sync) and contributes nothing.
    participants = [
        sorted(e["dp_rank"] for e in j.seen if e.get("it") == it and e["participating"])
        for it in range(20)
    ]
    assert participants[0] in ([0, 1], [2, 3]) and participants[1:] == [[0, 1, 2, 3]] * 19
    expected = replay(participants)
    for replica in range(GROUPS):
        for name, want in expected.items():
            got = torch.tensor(j.final[replica][name])
            atol = 1e-4 if backend == "gloo" else 1e-3  # CUDA kernels round differently
            assert torch.allclose(got, want, rtol=0, atol=atol), (
                f"group {replica} {name}: off the replay by {(got - want).abs().max():.3g}"
            )


def is_step(replica: int, pred: Any = lambda e: True) -> Any:
    return lambda e: e.get("event") == "step" and e["replica"] == replica and pred(e)


# torchft's timeout variables, as a torchtitan user sets them
TORCHFT_ENV = {
    "TORCHFT_TIMEOUT_SEC": "30",
    "TORCHFT_QUORUM_TIMEOUT_SEC": "45",
    "TORCHFT_CONNECT_TIMEOUT_SEC": "20",
    "TORCHFT_QUORUM_RETRIES": "1",
}


def test_a_killed_group_restarts_heals_and_ends_identical_while_survivors_commit() -> None:
    # torchtitan README's lighthouse command, as torchft's own command line
    flags = ("--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000")
    with (
        torchft_lighthouse(*flags) as address,
        job(address, "hsdp", GROUPS, ["--steps", "100000"], TORCHFT_ENV) as j,
    ):
        for replica in range(GROUPS):
            j.start_group(replica)
        ready = j.wait_for(lambda e: e.get("event") == "ready", "a rank to start")
        assert ready["timeouts"] == [30.0, 45.0, 20.0, 1]  # the variables won
        j.wait_for(
            is_step(1, lambda e: e["committed"] >= 3 and e["participants"] == 2),
            "both groups committing together",
        )
        j.kill_group(1)
        at_kill = max(e["committed"] for e in j.seen if e.get("replica") == 0 and "committed" in e)
        alone = j.wait_for(
            is_step(0, lambda e: e["committed"] >= at_kill + 3 and e["participants"] == 1),
            "the survivors to commit without the killed group",
        )
        j.start_group(1)
        rejoined = j.wait_for(
            is_step(1, lambda e: e["participants"] == 2 and e["committed"] > alone["committed"]),
            "the restarted group to heal and commit with the survivors",
        )
        j.stop_at(rejoined["committed"] + 3)
        steps = steps_of(j, GROUPS * GROUP_SIZE)
    for rank in range(GROUP_SIZE):
        survivor, healed = steps[(0, rank)][-1], steps[(1, rank)][-1]
        assert survivor["committed"] == healed["committed"] == rejoined["committed"] + 3
        assert survivor["optim"] == healed["optim"], f"rank {rank}: optimizer state differs"
        differ = [k for k in survivor["params"] if survivor["params"][k] != healed["params"][k]]
        assert not differ, f"rank {rank}: the healed group differs in {differ}"
        assert survivor["digest"] == healed["digest"], f"rank {rank}: the healed group differs"
    # survivors' commits never went back, and went on while group 1 was down
    for rank in range(GROUP_SIZE):
        committed = [e["committed"] for e in steps[(0, rank)]]
        assert committed == sorted(committed)


def test_diloco_with_two_fragments_syncs_each_fragment_identically(
    lighthouse_for_two: LighthouseServer,
) -> None:
    with job(
        lighthouse_for_two.address(), "diloco", GROUPS, ["--steps", "20", "--sync-steps", "4"]
    ) as j:
        for replica in range(GROUPS):
            j.start_group(replica)
        steps = steps_of(j, GROUPS * GROUP_SIZE)
    for rank in range(GROUP_SIZE):
        a, b = steps[(0, rank)], steps[(1, rank)]
        assert len(a) == len(b) == 20
        # every 2 inner steps one of the 2 fragments syncs: 10 outer steps committed
        assert a[-1]["committed"] == b[-1]["committed"] == 10
        for fragment in range(2):
            same = [
                x["it"]
                for x, y in zip(a, b, strict=True)
                if x["fragments"][fragment] == y["fragments"][fragment]
            ]
            assert len(same) >= 5, f"fragment {fragment} agreed only after inner steps {same}"
        # between syncs each group trains on its own data: the whole model differs
        assert any(x["digest"] != y["digest"] for x, y in zip(a, b, strict=True))
    losses = [s["loss"] for s in steps[(0, 0)]]
    assert losses[-1] < 0.7 * losses[0], losses


def test_local_sgd_averages_every_sync_steps(lighthouse_for_two: LighthouseServer) -> None:
    with job(
        lighthouse_for_two.address(), "local_sgd", GROUPS, ["--steps", "20", "--sync-steps", "2"]
    ) as j:
        for replica in range(GROUPS):
            j.start_group(replica)
        steps = steps_of(j, GROUPS * GROUP_SIZE)
    for rank in range(GROUP_SIZE):
        a, b = steps[(0, rank)], steps[(1, rank)]
        assert a[-1]["committed"] == b[-1]["committed"] == 10
        for x, y in zip(a, b, strict=True):
            synced = (x["it"] + 1) % 2 == 0
            assert (x["digest"] == y["digest"]) == synced, f"inner step {x['it']}"
    losses = [s["loss"] for s in steps[(0, 0)]]
    assert losses[-1] < 0.7 * losses[0], losses
