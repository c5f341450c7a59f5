"""DistributedDataParallel's private parts: building a new reducer for a module.

Our DDP reduces its buckets in place, and after a step whose reduction did not
succeed (an op that may still write into its bucket later, from a retired
backend) it gives the module a new reducer with new buckets, the way
``DistributedDataParallel.__init__`` built the first one. Torch has no public
way to do that, so it is done here, from the methods ``__init__`` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.nn import parallel

from torchft_pg._torch_internals.names import PrivateName

__all__ = ["RELIED_ON", "rebuild_reducer"]

_DDP = "torch.nn.parallel.DistributedDataParallel"
RELIED_ON: tuple[PrivateName, ...] = (
    PrivateName(owner=_DDP, name="_build_params_for_reducer", use="rebuild_reducer"),
    PrivateName(owner=_DDP, name="_ddp_init_helper", use="rebuild_reducer"),
    PrivateName(owner=_DDP, name="_build_debug_param_to_name_mapping", use="rebuild_reducer"),
    PrivateName(owner="torch.distributed", name="_register_comm_hook", use="rebuild_reducer"),
)


def rebuild_reducer(
    ddp: parallel.DistributedDataParallel, hook_state: Any, hook: Callable[..., Any]
) -> None:
    """Give `ddp` a new reducer (new buckets, the same layout for the same
    parameters) with `hook` registered on it (`hook_state` passed to it), as
    ``DistributedDataParallel.__init__`` and ``register_comm_hook`` do
    (``_build_params_for_reducer``, ``_ddp_init_helper``,
    ``_build_debug_param_to_name_mapping``, ``dist._register_comm_hook``). The
    old reducer and its buckets are dropped here; an op still holding a bucket
    keeps it alive."""
    module: Any = ddp  # torch leaves these methods untyped
    parameters, expect_sparse_gradient = module._build_params_for_reducer()
    module._ddp_init_helper(
        parameters,
        expect_sparse_gradient,
        module._build_debug_param_to_name_mapping(parameters),
        module.static_graph,
    )
    c10d: Any = dist
    c10d._register_comm_hook(module.reducer, hook_state, hook)
