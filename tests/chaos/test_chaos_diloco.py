"""Chaos with DiLoCo: replica groups die and come back while they train semi-synchronously.

Each replica group trains with `DiLoCo` (Adam inner steps, Nesterov SGD outer
steps, two fragments syncing in turn with their allreduce started an inner
step early); each outer sync is the Manager step the supervisor sees. Each
run asserts the chaos ledger's invariants on outer steps (no step backwards,
one step one quorum, every committer holds the same global state after it),
that the outer optimizers' step count is the number of committed outer steps
on every commit and at the end, that every replica ends with the same global
state, and the DiLoCo replay (`tests.chaos_support.diloco_oracle`): every
replica's trace, inner steps, heals and syncs, replayed in one process,
reaches every committed global digest and every final state bit for bit.

The pure tests below show the replay and the outer-step check fail on a
trace with an outer step lost or a state that is not its history's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.chaos_support import ChaosConfig, ChaosReport, run_chaos
from tests.chaos_support.diloco_events import OuterStepEnded, PseudoGradient
from tests.chaos_support.diloco_oracle import DiLoCoHistory, check
from tests.chaos_support.diloco_workload import (
    Algorithm,
    DiLoCoSettings,
    diloco_flat_state,
    fragment_modules,
    global_digest,
    outer_optimizers,
)
from tests.chaos_support.outer_ledger import OuterLedger
from tests.chaos_support.workload import FlatState, Workload, state_checksum
from torchft_pg.chaos import Fault, FaultPlan

# As in test_chaos.py: a hang fails on the run's stall bound (ChaosConfig.stall_s);
# this bounds a run that keeps going but never ends, far above a loaded machine's time.
RUN_BOUND_S = 900.0

# 2 fragments syncing in turn, one every 4 inner steps; the allreduce starts 1 step early.
SETTINGS = DiLoCoSettings(sync_every=8, fragments=2, fragment_sync_delay=1)


def _check(report: ChaosReport) -> None:
    assert report.ok, "\n".join(report.failures)
    steps = set(report.final_steps.values())
    assert len(steps) == 1 and report.oracle_steps == steps.pop()  # the replay ran to the end
    assert report.oracle_max_error == 0.0  # bit for bit
    assert len(set(report.checksums.values())) == 1  # the same global state everywhere
    restarted = {(r, inc) for r, inc, _, _ in report.heals if inc > 0}
    assert len(restarted) == report.restarts  # every restarted replica healed


@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_diloco_kills_and_a_lighthouse_restart_lose_no_outer_step() -> None:
    """A kill mid-window, a lighthouse restart, a kill with the pseudo-gradient
    allreduce in flight, a failed allreduce and a kill before the vote."""
    plan = FaultPlan(
        {
            (1, 3): Fault.KILL_REPLICA,  # mid-window: one inner step after the last sync
            (0, 6): Fault.RESTART_LIGHTHOUSE,
            (2, 9): Fault.KILL_ALLREDUCE_AFTER,
            (1, 12): Fault.FAIL_ALLREDUCE,  # votes no alone: behind, heals next sync
            (0, 15): Fault.KILL_COMMIT_BEFORE,
        }
    )
    report = run_chaos(
        ChaosConfig(
            replicas=3,
            steps=20,
            plan=plan,
            algorithm=Algorithm.DILOCO,
            diloco=SETTINGS,
            deadline_s=RUN_BOUND_S,
            verbose=False,
        )
    )
    _check(report)
    assert report.kills == report.restarts == 3 and report.lighthouse_restarts == 1
    assert sorted((r, phase) for r, _, _, phase in report.deaths) == [
        (0, "commit_before"),
        (1, "forward"),
        (2, "allreduce_after"),
    ]
    epochs = list(dict.fromkeys(q.split("/")[0] for q in report.quorum_ids))
    assert len(epochs) == 2  # one epoch before the lighthouse restart, a new one after


@pytest.mark.slow
@pytest.mark.timeout(660)  # the run's own deadline is 600 s
def test_diloco_soak_with_every_single_rank_fault() -> None:
    """12 kills and 14 other faults of every kind a single-rank group can take
    (phase kills, heal kills, freezes, delays, lighthouse restarts), 3 overlapping."""
    kinds = [k for k in Fault if k not in (Fault.KILL_BABY_CHILD, Fault.PARTIAL_KILL)]
    plan = FaultPlan.random(
        seed=13,
        replicas=3,
        steps=240,
        kills=12,
        other_faults=14,
        gap=8,
        same_replica_gap=16,
        kinds=kinds,
        overlaps=3,
    )
    assert plan.count(Fault.FREEZE) > 0
    report = run_chaos(
        ChaosConfig(
            replicas=3,
            steps=240,
            plan=plan,
            algorithm=Algorithm.DILOCO,
            diloco=SETTINGS,
            heartbeat_timeout_ms=2000,
            deadline_s=600,
            verbose=False,
        )
    )
    _check(report)
    assert report.kills >= plan.count(Fault.KILL_REPLICA) and report.freezes


# -- the replay and the outer-step check, on a trace built by hand --------------------


def _one_sync() -> tuple[DiLoCoHistory, dict[tuple[int, int], FlatState]]:
    """One replica alone: two inner steps, then one committed outer step (one fragment)."""
    w = Workload(seed=0, hidden=8)
    settings = DiLoCoSettings(sync_every=2, fragments=1)
    model, inner = w.build()
    outers = outer_optimizers(fragment_modules(model, 1), settings)
    backup = {n: p.detach().clone() for n, p in model.named_parameters()}
    for data_step in (0, 1):
        inner.zero_grad()
        x, y = w.batch(0, data_step)
        w.loss(model(x), y).backward()
        inner.step()
    with torch.no_grad():
        pseudo = [backup[n] - p for n, p in model.named_parameters()]
        for (n, p), g in zip(model.named_parameters(), pseudo, strict=True):
            p.copy_(backup[n])
            p.grad = g.clone()  # the mean of one contribution is itself
    outers[0].step()
    model.zero_grad(set_to_none=True)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    who = {"replica": 0, "group_rank": 0, "incarnation": 0}
    sent = PseudoGradient(
        **who,
        at=0.0,
        inner_steps=(0, 1),
        quorum="e/1",
        step=0,
        fragment=0,
        participating=True,
        divisor=1,
        digest=state_checksum(pseudo),
        norm=0.0,
    )
    ended = OuterStepEnded(
        **who,
        at=0.0,
        step=0,
        committed=True,
        quorum="e/1",
        participants=1,
        loss=0.0,
        digest=global_digest([after], outers),
        inner_steps=(),
        fragment=0,
        outer_steps=1,
    )
    history = DiLoCoHistory(workload=w, settings=settings, traces={(0, 0): (sent, ended)})
    return history, {(0, 0): diloco_flat_state(model, inner, [after], outers)}


def test_the_replay_follows_an_honest_trace_bit_for_bit() -> None:
    history, finals = _one_sync()
    verdict = check(history, finals)
    assert verdict.ok, verdict.failures
    assert verdict.outer_steps_replayed == 1 and verdict.max_error == 0.0


def test_the_replay_names_a_trace_whose_inner_steps_are_not_its_state() -> None:
    history, finals = _one_sync()
    sent, ended = history.traces[(0, 0)]
    assert isinstance(sent, PseudoGradient)
    skipped = dataclasses.replace(sent, inner_steps=(0,))  # an inner step not replayed
    verdict = check(dataclasses.replace(history, traces={(0, 0): (skipped, ended)}), finals)
    assert any("sent a pseudo-gradient for outer step 0" in f for f in verdict.failures)


def test_the_replay_names_the_first_outer_step_whose_global_state_is_wrong() -> None:
    history, finals = _one_sync()
    sent, ended = history.traces[(0, 0)]
    assert isinstance(ended, OuterStepEnded)
    wrong = dataclasses.replace(ended, digest="0" * 16)
    verdict = check(dataclasses.replace(history, traces={(0, 0): (sent, wrong)}), finals)
    assert any("committed outer step 0" in f and "global digest" in f for f in verdict.failures)


def test_the_replay_refuses_an_outer_step_committed_without_its_pseudo_gradients() -> None:
    history, finals = _one_sync()
    _, ended = history.traces[(0, 0)]
    verdict = check(dataclasses.replace(history, traces={(0, 0): (ended,)}), finals)
    assert any("replay stuck" in f and "needs 1 pseudo-gradients" in f for f in verdict.failures)


def test_the_outer_ledger_flags_an_outer_step_lost_or_applied_twice() -> None:
    history, _ = _one_sync()
    _, ended = history.traces[(0, 0)]
    assert isinstance(ended, OuterStepEnded)
    ledger = OuterLedger(workload=history.workload, settings=history.settings)
    ledger.record(ended)
    assert ledger.failures == []
    ledger.record(dataclasses.replace(ended, step=1, outer_steps=3))  # one applied twice
    assert ledger.failures == [
        "replica 0 (inc 0) committed outer step 1 with its outer optimizers at 3 steps, "
        "not 2: an outer step lost or applied twice"
    ]


def test_diloco_settings_refuse_a_schedule_the_workload_cannot_run() -> None:
    with pytest.raises(ValueError, match="fragments must be 1 or 2"):
        DiLoCoSettings(fragments=3, sync_every=6)
    with pytest.raises(ValueError, match="multiple of fragments"):
        DiLoCoSettings(fragments=2, sync_every=3)
    with pytest.raises(ValueError, match="fragment_sync_delay must be in"):
        DiLoCoSettings(fragments=2, sync_every=4, fragment_sync_delay=2)
    with pytest.raises(ValueError, match="group_world_size=2"):
        ChaosConfig(algorithm=Algorithm.DILOCO, group_world_size=2)
