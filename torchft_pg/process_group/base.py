"""`ProcessGroup`: the reconfigurable c10d process group every torchft_pg PG derives from.

To c10d the object is a size-1 group (its C++ size is fixed at construction);
the real rank and world size live in Python and change on every `configure`.
Python callers (`torch.distributed.*` with ``group=pg``, DeviceMesh, our
Manager) see the live values through `rank()` and `size()`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceScatterOptions,
    Work,
)
from torch._C._distributed_c10d import ProcessGroup as BaseProcessGroup

from torchft_pg.store import parse_store_address

__all__ = ["ProcessGroup", "validate_configure_args"]


def validate_configure_args(store_addr: str, rank: object, world_size: object) -> None:
    """Raise ValueError/TypeError naming the bad value of a `configure` call."""
    parse_store_address(store_addr)
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            hint = ""
            if name == "rank" and isinstance(value, str):
                hint = " (torchft's 4-argument form: pass replica_id=... as a keyword)"
            raise TypeError(f"{name} must be an int, got {value!r}{hint}")
    assert isinstance(rank, int) and isinstance(world_size, int)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


class ProcessGroup(BaseProcessGroup):
    """A c10d ProcessGroup that can be re-formed at run time with `configure`.

    Subclasses implement the collectives; every collective takes and returns the
    same types as c10d's (lists of tensors, option objects, a `Work`).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(0, 1)  # type: ignore[call-arg]  # c10d sees size 1; see module doc
        self._group_name: str | None = None
        self._registered: BaseProcessGroup | None = None
        self._c10d_ranks: int | None = None  # world size published to c10d's rank table
        self._keep_alive_on_destroy = False  # unregister() in progress: ignore c10d's shutdown()

    # -- lifecycle ---------------------------------------------------------------
    def configure(
        self, store_addr: str, rank: int, world_size: int, replica_id: str | None = None
    ) -> None:
        """Form a new group of `world_size` members rendezvousing at `store_addr`.

        Blocks until the new group is ready. Every call must get a unique
        ``host:port/prefix`` address. The old group, if any, is torn down.
        """
        raise NotImplementedError("configure")

    def abort(self) -> None:
        """Abort in-flight work and drop the group; idempotent. `configure` rebuilds it."""

    def shutdown(self) -> None:
        """Release sockets and child processes; idempotent and safe after a failure."""

    def errored(self) -> Exception | None:
        """The error that made this group unusable, or None."""
        return None

    def interrupt_configure(self, reason: str) -> None:
        """Make a `configure` in progress fail now (a member is known dead); default: no-op."""

    def set_timeout(self, timeout: timedelta) -> None:
        """Set the timeout of future operations."""
        raise NotImplementedError("set_timeout")

    def getBackendName(self) -> str:
        raise NotImplementedError("getBackendName")

    def size(self) -> int:
        raise NotImplementedError("size")

    def rank(self) -> int:
        raise NotImplementedError("rank")

    # -- collectives (c10d signatures) -------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions | ReduceOp) -> Work:
        raise NotImplementedError("allreduce")

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions
    ) -> Work:
        raise NotImplementedError("allreduce_coalesced")

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensor: list[torch.Tensor],
        opts: AllgatherOptions,
    ) -> Work:
        raise NotImplementedError("allgather")

    def allgather_into_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions,
    ) -> Work:
        raise NotImplementedError("allgather_into_tensor_coalesced")

    def alltoall_base(
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions,
    ) -> Work:
        raise NotImplementedError("alltoall_base")

    def barrier(self, opts: BarrierOptions) -> Work:
        raise NotImplementedError("barrier")

    def broadcast(self, tensor_list: list[torch.Tensor], opts: BroadcastOptions) -> Work:
        raise NotImplementedError("broadcast")

    def broadcast_one(self, tensor: torch.Tensor, root: int) -> Work:
        """Broadcast one tensor from group rank `root`."""
        opts = BroadcastOptions()
        opts.rootRank = root
        return self.broadcast([tensor], opts)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> Work:
        raise NotImplementedError("recv")

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> Work:
        raise NotImplementedError("send")

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: ReduceScatterOptions,
    ) -> Work:
        raise NotImplementedError("reduce_scatter")

    def reduce_scatter_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: ReduceScatterOptions,
    ) -> Work:
        raise NotImplementedError("reduce_scatter_tensor_coalesced")

    # -- c10d registration (DeviceMesh, functional collectives) --------------------
    def register(self, name: str) -> BaseProcessGroup:
        """Register this PG with c10d under `name`, for DeviceMesh and functional collectives.

        Creates a size-1 c10d group (on the default group's local rank) whose
        backend is this object, so ``_functional_collectives.all_reduce(t, "sum", pg)``
        and ``DeviceMesh.from_group`` resolve it. Needs ``init_process_group``.
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"register() needs a non-empty group name, got {name!r}")
        if not dist.is_initialized():
            raise RuntimeError(
                "register() needs torch.distributed.init_process_group() first: c10d "
                "groups are created relative to the default group"
            )
        if self._registered is not None:
            raise RuntimeError(
                f"already registered as {self._group_name!r}; call unregister() first"
            )
        backend_name = f"{self.getBackendName()}:{name}"

        def create(store: Any, rank: int, world_size: int, timeout: timedelta) -> ProcessGroup:
            return self

        devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        dist.Backend.register_backend(backend_name, create, devices=devices)
        group = dist.new_group(
            ranks=[dist.get_rank()],
            backend=backend_name,
            group_desc=name,
            use_local_synchronization=True,
        )
        assert group is not None
        self._registered = group
        # With a factory that returns a ProcessGroup, c10d registers that object
        # itself and keeps its name only in its own table.
        name_in_c10d: str = _c10d_world().pg_names[group]
        if group is self:
            self._set_group_name(name_in_c10d)
        self._group_name = name_in_c10d
        return group

    def unregister(self) -> None:
        """Remove the c10d registration made by `register`; idempotent.

        This group stays usable. (``dist.destroy_process_group(group)`` also
        works, and shuts the group down as c10d does for any group.)
        """
        group = self._registered
        if group is not None and dist.is_initialized() and group in _c10d_world().pg_map:
            self._keep_alive_on_destroy = True
            try:
                dist.destroy_process_group(group)  # reads group_name: clear it afterwards
            finally:
                self._keep_alive_on_destroy = False
        self._registered = None
        self._group_name = None
        if group is self and self._c10d_ranks is not None:
            self._publish_ranks(self._c10d_ranks)

    @property
    def group_name(self) -> str:
        """The c10d name this PG is registered under (see `register`)."""
        if self._group_name is None:
            raise RuntimeError(
                f"{type(self).__name__} is not registered; call register(name) first"
            )
        return self._group_name

    def _publish_ranks(self, world_size: int | None) -> None:
        """Tell c10d this group's ranks, so `dist.send/recv/broadcast(group=pg)` work.

        A cross-replica group has no global ranks of its own: ranks passed to
        ``torch.distributed`` calls with ``group=pg`` are ranks in this group.
        `None` removes the entry (shutdown), so c10d holds no reference to us.
        """
        self._c10d_ranks = world_size
        ranks = _c10d_world().pg_group_ranks
        if self._registered is not None:
            return  # c10d's size-1 view from register() stays until unregister()
        if world_size is None:
            ranks.pop(self, None)
        else:
            ranks[self] = {r: r for r in range(world_size)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _c10d_world() -> Any:
    from torch.distributed.distributed_c10d import _world

    return _world
