"""The reference replica training loop with DiLoCo: inner Adam steps, outer syncs as Manager steps.

Each replica group trains the workload's MLP with `torchft_pg.local_sgd.DiLoCo`:
Adam inner steps on its own batches (``Workload.batch(replica, data_step)``,
``data_step = outer step * interval + inner step in the window``), and every
``interval`` inner steps one fragment's sync, which is the Manager step the
supervisor sees: an `OuterStepEnded` per sync, with the digest of the global
state (every fragment's global parameters and outer optimizer) after a
commit. The outer optimizers are SGD with Nesterov momentum and count their
steps (`diloco_workload`); the pseudo-gradients are summed in float64
(`exact_sum`), so the replay (`diloco_oracle`) can follow the replicas bit
for bit from their traces (`diloco_events`).

Faults: KILL_REPLICA lands mid-window, in the forward of inner step
``(interval - fragment_sync_delay) // 2`` of the window it fires in (or at
once if the window is further on), so the replica's progress since the last
sync is lost; the phase faults land in the sync (its allreduce, its vote,
its quorum's configure and heal), as for DDP.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from tests.chaos_support.diloco_events import (
    Healed,
    OuterStepEnded,
    PseudoGradient,
    Serving,
    SnapshotId,
)
from tests.chaos_support.diloco_workload import (
    diloco_flat_state,
    fragment_modules,
    global_digest,
    outer_optimizers,
    outer_steps,
)
from tests.chaos_support.events import Done
from tests.chaos_support.harness import Commands, Events, RankHarness, TrainerConfig
from tests.chaos_support.workload import Workload, state_checksum
from torchft_pg.chaos.plan import Fault
from torchft_pg.local_sgd import DiLoCo

__all__ = ["LINEAGE_KEY", "train_diloco"]

#: The state-dict key under which a heal carries who served it (`SnapshotId`).
LINEAGE_KEY = "chaos_lineage"


class _Trace:
    """This rank's trace (`diloco_events`) and what it knows of the sync in progress.

    Written by the training thread and, while serving a healer, by the quorum
    thread (the training thread then waits in its synchronous quorum); the
    lock keeps each event's `inner_steps` whole.
    """

    def __init__(self, harness: RankHarness, backups: list[dict[str, torch.Tensor]]) -> None:
        self._h = harness
        self._backups = backups  # DiLoCo's global parameters, per fragment (live)
        self._lock = threading.Lock()
        self._inner: list[int] = []
        self._serves = 0
        self.healed: Healed | None = None  # the heal of the sync in progress
        self.sent: PseudoGradient | None = None  # its allreduce, once issued
        self.applied_norm: float | None = None  # the averaged pseudo-gradient applied
        self.fragments: list[torch.nn.Module] = []

    def inner_step(self, data_step: int) -> None:
        with self._lock:
            self._inner.append(data_step)

    def take_inner(self) -> tuple[int, ...]:
        with self._lock:
            steps, self._inner = tuple(self._inner), []
        return steps

    def end_sync(self) -> None:
        self.healed, self.sent, self.applied_norm = None, None, None

    def voting_step(self, started_at: int) -> int:
        """The outer step the sync that started at the Manager's step `started_at` is
        voted as: for a healer, the step it healed to (its source's)."""
        return self.healed.step if self.healed is not None else started_at

    # -- the lineage state-dict entry: who a healed state came from ---------------
    def save(self) -> dict[str, int]:
        """Called as this rank's state is copied for a healer (quorum thread)."""
        step = self._h.m.current_step()
        with self._lock:
            serve, self._serves = self._serves, self._serves + 1
            steps, self._inner = tuple(self._inner), []
        self._h.events.put(
            Serving(**self._h.who, at=time.time(), inner_steps=steps, serve=serve, step=step)
        )
        c = self._h.config
        return {"replica": c.replica, "incarnation": c.incarnation, "serve": serve, "step": step}

    def load(self, state: dict[str, Any]) -> None:
        """Called as a healed state is loaded (training thread, in the quorum)."""
        source = SnapshotId(
            replica=int(state["replica"]),
            incarnation=int(state["incarnation"]),
            serve=int(state["serve"]),
        )
        self.healed = Healed(
            **self._h.who,
            at=time.time(),
            inner_steps=self.take_inner(),
            source=source,
            step=int(state["step"]),
        )
        self._h.events.put(self.healed)

    # -- hooks -------------------------------------------------------------------
    def on_allreduce(self, tensors: list[torch.Tensor]) -> None:
        """Report the sync's pseudo-gradient at its first allreduce (before it is sent)."""
        if self.sent is not None:
            return
        m = self._h.m
        # The fragment whose first parameter has the shape of the first tensor sent:
        # what DiLoCo put on the wire (the workload's fragments differ in shape).
        fragment = next(
            i
            for i, f in enumerate(self.fragments)
            if next(f.parameters()).shape == tensors[0].shape
        )
        with torch.no_grad():
            pseudo = [
                self._backups[fragment][name] - p.detach()
                for name, p in self.fragments[fragment].named_parameters()
            ]
        epoch, quorum_id = m.quorum_id()
        self.sent = PseudoGradient(
            **self._h.who,
            at=time.time(),
            inner_steps=self.take_inner(),
            quorum=f"{epoch}/{quorum_id}",
            step=self.voting_step(m.current_step()),
            fragment=fragment,
            participating=m.is_participating(),
            divisor=m.num_participants(),
            digest=state_checksum(pseudo),
            norm=float(torch.cat([g.reshape(-1) for g in pseudo]).norm().item()),
        )
        self._h.events.put(self.sent)

    def before_outer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad.reshape(-1) for g in optimizer.param_groups for p in g["params"]]
        self.applied_norm = float(torch.cat(grads).norm().item())


def train_diloco(config: TrainerConfig, events: Events, commands: Commands | None) -> None:
    """`trainer.run_trainer` for ``Algorithm.DILOCO`` (single-rank replica groups)."""
    if config.group_world_size != 1:
        raise ValueError(
            f"the DiLoCo chaos trainer runs single-rank replica groups, got "
            f"group_world_size={config.group_world_size}"
        )
    settings = config.diloco
    interval, delay = settings.interval, settings.fragment_sync_delay
    workload = Workload(seed=config.seed, hidden=config.hidden)
    model, inner = workload.build()
    fragments = fragment_modules(model, settings.fragments)
    outers = outer_optimizers(fragments, settings)
    backups: list[dict[str, torch.Tensor]] = []
    trace: _Trace | None = None

    def on_allreduce(tensors: list[torch.Tensor]) -> None:
        assert trace is not None
        trace.on_allreduce(tensors)

    harness = RankHarness(
        config, events, commands, on_allreduce, use_async_quorum=False, exact_sum=True
    )
    trace = _Trace(harness, backups)
    trace.fragments = fragments
    m = harness.m
    who = harness.who
    m.register_state_dict_fn("model", model.load_state_dict, model.state_dict)
    m.register_state_dict_fn("optim", inner.load_state_dict, inner.state_dict)
    diloco = DiLoCo(
        m, fragments, inner, outers, sync_every=settings.sync_every, fragment_sync_delay=delay
    )
    m.register_state_dict_fn(LINEAGE_KEY, trace.load, trace.save)
    # DiLoCo has no public accessor for its global parameters (torchft's neither).
    backups.extend(f.original_parameters for f in diloco._fragments)
    for outer in outers:
        outer.register_step_pre_hook(trace.before_outer_step)
    harness.start()
    local = 0  # inner steps since the last fragment sync (DiLoCo's count)
    kill_at: int | None = None  # KILL_REPLICA fired: die in the forward of this inner step
    started_at = 0  # the Manager's step when the sync in progress started
    committed = False
    try:
        with diloco:
            while True:
                harness.poll()
                if local == 0 and harness.finished(committed):
                    break
                step = m.current_step()
                fault = harness.fire_due(step)  # a DELAY stalls in there
                if fault == Fault.KILL_REPLICA:
                    kill_at = max(local, (interval - delay) // 2)
                if config.step_time_s:
                    time.sleep(config.step_time_s)  # simulated compute, not synchronization
                inner.zero_grad()
                data_step = step * interval + local
                x, y = workload.batch(config.replica, data_step)
                loss = workload.loss(model(x), y)
                if kill_at == local:
                    harness.faults.after_forward()  # the KILL_REPLICA fired dies here
                loss.backward()
                trace.inner_step(data_step)
                if local == interval - delay - 1:
                    started_at = step  # DiLoCo starts this sync inside inner.step()
                inner.step()  # DiLoCo's hooks: maybe start a sync, maybe finish one
                local += 1
                if local < interval:
                    continue
                local = 0
                voted = trace.voting_step(started_at)
                committed = m.current_step() == voted + 1
                epoch, quorum_id = m.quorum_id()
                # The fragment DiLoCo restored: the one it sent, else (no allreduce
                # issued) its rule's: the Manager's step after the sync's quorum.
                sent = trace.sent
                fragment = sent.fragment if sent is not None else voted % len(fragments)
                events.put(
                    OuterStepEnded(
                        **who,
                        at=time.time(),
                        step=voted,
                        committed=committed,
                        quorum=f"{epoch}/{quorum_id}",
                        participants=m.num_participants(),
                        loss=float(loss.item()),
                        digest=global_digest(backups, outers) if committed else None,
                        grad_norm=trace.applied_norm if committed else None,
                        inner_steps=trace.take_inner(),
                        fragment=fragment,
                        outer_steps=outer_steps(outers),
                    )
                )
                trace.end_sync()
        events.put(
            Done(
                **who,
                at=time.time(),
                step=m.current_step(),
                checksum=global_digest(backups, outers),
                state=diloco_flat_state(model, inner, backups, outers),
            )
        )
    finally:
        harness.shutdown()
