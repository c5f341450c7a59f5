"""`DiLoCo`: inner steps alone, outer steps on averaged pseudo-gradients, fragment by fragment.

Each replica group steps the inner optimizer on its own data. Every
``sync_every / len(model_fragments)`` inner steps one fragment syncs (see
`fragment`): its pseudo-gradient (global minus local parameters) is averaged
over the replica groups and the outer optimizer steps the global parameters
with it. Fragments take turns in order: the one that syncs is
``manager.current_step() % len(model_fragments)``, so after a failed commit
the same fragment syncs again at the next turn and every group always agrees
on which fragment is on the wire. With one fragment this is DiLoCo; with
several, Streaming DiLoCo.

With ``fragment_sync_delay = d`` a fragment's quorum and allreduce start `d`
inner steps before its sync point, overlapping those steps; the
pseudo-gradient is the one at the start, the mixing with local parameters
(`fragment_update_alpha`) uses those at the sync point.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from torchft_pg.quantization import Quantization
from torchft_pg.semisync.fragment import Fragment
from torchft_pg.semisync.local_sgd import StepHooks, check_sync_every

if TYPE_CHECKING:
    from torchft_pg.manager import Manager

__all__ = ["USE_BUCKETIZATION_ENV", "DiLoCo"]

USE_BUCKETIZATION_ENV = "TORCHFT_USE_BUCKETIZATION"
"""Set to ``True`` to bucket the pseudo-gradients whatever `use_bucketization` says (torchft's)."""

_DEFAULT_BUCKET_MB = 1024


class DiLoCo(StepHooks):
    """Fault-tolerant (Streaming) DiLoCo over `manager`'s replica groups.

    Use as a context manager around the training loop; while entered, step
    hooks on `inner_optimizer` count its steps and run the fragment syncs.

    Args:
        manager: its quorum must be synchronous (``use_async_quorum=False``): a
            healing group takes the global parameters and the outer optimizer
            state before it computes its pseudo-gradient.
        model_fragments: modules whose parameters sync together, disjoint.
        inner_optimizer: the optimizer stepped every step, on all fragments.
        outer_optimizer: one optimizer over all fragments, or one per fragment.
        sync_every: inner steps between two syncs of the same fragment; a
            multiple of ``len(model_fragments)``.
        backup_device: where the global parameters are kept (default: CPU).
        pin_memory: pin a CPU backup when CUDA is available.
        use_bucketization: allreduce the pseudo-gradients in flat buckets of at
            most `bucket_cap_mb` MiB (default 1024) instead of one per parameter.
        should_quantize: send the pseudo-gradients in a lower precision
            (`quantization`: "int8" with per-chunk scales, the default, or
            "bf16") and sum them in float32; see `torchft_pg.quantization`.
        fragment_sync_delay: inner steps between starting a fragment's
            allreduce and its sync point; less than ``sync_every / len(model_fragments)``.
        fragment_update_alpha: after a sync, parameters are
            ``(1 - alpha) * global + alpha * local``; in [0, 1].
        quantization: the encoding `should_quantize` uses (keyword only; not
            in torchft, which has one fixed scheme).

    A sync is one Manager step. The backup starts as the parameters at
    construction, so every group must construct DiLoCo from the same weights
    (or heal first).
    """

    def __init__(
        self,
        manager: Manager,
        model_fragments: Sequence[torch.nn.Module],
        inner_optimizer: torch.optim.Optimizer,
        outer_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        sync_every: int,
        backup_device: torch.device | None = None,
        pin_memory: bool = True,
        use_bucketization: bool = False,
        bucket_cap_mb: float | None = None,
        should_quantize: bool = False,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
        *,
        quantization: Quantization | str = Quantization.INT8,
    ) -> None:
        super().__init__(inner_optimizer)
        fragments = list(model_fragments)
        outers = (
            [outer_optimizer] * len(fragments)
            if isinstance(outer_optimizer, torch.optim.Optimizer)
            else list(outer_optimizer)
        )
        _check(manager, fragments, outers, sync_every)
        scheme = Quantization.parse(quantization) if should_quantize else None
        n = len(fragments)
        self._sync_every = sync_every // n  # inner steps between two fragment syncs
        if (
            isinstance(fragment_sync_delay, bool)
            or not isinstance(fragment_sync_delay, int)
            or not 0 <= fragment_sync_delay < self._sync_every
        ):
            raise ValueError(
                f"fragment_sync_delay must be an int in [0, sync_every / len(model_fragments)"
                f" = {self._sync_every}), got {fragment_sync_delay!r}"
            )
        if not 0.0 <= fragment_update_alpha <= 1.0:
            raise ValueError(
                f"fragment_update_alpha must be in [0, 1], got {fragment_update_alpha!r}"
            )
        if bucket_cap_mb is not None and bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
        bucketize = use_bucketization or os.environ.get(USE_BUCKETIZATION_ENV) == "True"
        bucket_mb = bucket_cap_mb if bucket_cap_mb is not None else _DEFAULT_BUCKET_MB
        self._manager = manager
        # between syncs the groups' states differ by design: nothing to compare
        set_check = getattr(manager, "set_integrity_check_every", None)
        if set_check is not None:
            set_check(None)
        self._local_optimizer = inner_optimizer
        self._fragment_sync_delay = fragment_sync_delay
        self._local_step = 0  # inner steps since the last fragment sync
        self._syncing: Fragment | None = None  # started, not yet finished
        self._fragments = [
            Fragment(
                manager=manager,
                module=module,
                index=i,
                outer_optimizer=outers[i],
                backup_device=backup_device,
                pin_memory=pin_memory,
                bucket_bytes=int(bucket_mb * 1024 * 1024) if bucketize else None,
                fragment_update_alpha=float(fragment_update_alpha),
                quantization=scheme,
            )
            for i, module in enumerate(fragments)
        ]
        for fragment in self._fragments:
            fragment.save_parameters()
            manager.register_state_dict_fn(
                fragment.key, fragment.load_state_dict, fragment.state_dict
            )

    def __enter__(self) -> DiLoCo:
        self._enter()
        return self

    def _current_fragment(self) -> Fragment:
        return self._fragments[self._manager.current_step() % len(self._fragments)]

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._manager.disallow_state_dict_read()

    def _post_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._manager.allow_state_dict_read()
        self._local_step += 1
        if self._local_step == self._sync_every - self._fragment_sync_delay:
            try:
                self._manager.start_quorum()  # synchronous: heals before the pseudo-gradient
                fragment = self._current_fragment()
                fragment.start_sync()
            except BaseException:
                self._local_step -= 1  # the next inner step starts this sync again
                raise
            self._syncing = fragment
        if self._local_step == self._sync_every:
            self._local_step = 0
            syncing, self._syncing = self._syncing, None
            assert syncing is not None  # started sync_every - delay steps in, or raised there
            syncing.finish_sync()


def _check(
    manager: Manager,
    fragments: list[torch.nn.Module],
    outers: list[torch.optim.Optimizer],
    sync_every: int,
) -> None:
    if manager._use_async_quorum:
        raise ValueError(
            "DiLoCo needs a synchronous quorum: construct the Manager with use_async_quorum=False"
        )
    if not fragments:
        raise ValueError("model_fragments must hold at least one module, got none")
    check_sync_every(sync_every)
    n = len(fragments)
    if sync_every < n or sync_every % n != 0:
        raise ValueError(
            f"sync_every ({sync_every}) must be a multiple of len(model_fragments) ({n})"
        )
    if len(outers) != n:
        raise ValueError(
            f"got {len(outers)} outer optimizers for {n} model fragments; "
            "pass one optimizer, or one per fragment"
        )
    seen: dict[int, int] = {}
    for i, module in enumerate(fragments):
        for name, p in module.named_parameters():
            if id(p) in seen:
                raise ValueError(
                    f"parameter {name!r} of model fragment {i} is also in fragment {seen[id(p)]}; "
                    "fragments must be disjoint"
                )
            seen[id(p)] = i
