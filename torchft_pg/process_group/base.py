"""`ProcessGroup`: the reconfigurable c10d process group every torchft_pg PG derives from.

To c10d the object is a size-1 group (its C++ size is fixed at construction);
the real rank and world size live in Python and change on every `configure`.
Python callers (`torch.distributed.*` with ``group=pg``, DeviceMesh, our
Manager) see the live values through `rank()` and `size()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceScatterOptions,
    Work,
)
from torch.distributed import ProcessGroup as BaseProcessGroup

from torchft_pg import _torch_internals
from torchft_pg._torch_internals import AllgatherOptions
from torchft_pg.store import StoreAddress

__all__ = [
    "ConfigureArgs",
    "ProcessGroup",
    "own_global_rank",
    "parse_configure_args",
    "resolve_global_ranks",
    "validate_configure_args",
    "validate_rank_and_size",
]


def validate_configure_args(store_addr: str, rank: object, world_size: object) -> StoreAddress:
    """Check a `configure` call's arguments; return the parsed store address.

    Raises ValueError/TypeError naming the bad value.
    """
    address = StoreAddress.parse(store_addr)
    validate_rank_and_size(rank, world_size)
    return address


def validate_rank_and_size(rank: object, world_size: object) -> None:
    """Raise ValueError/TypeError naming a bad `rank` or `world_size`."""
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


@dataclass(frozen=True, kw_only=True)
class ConfigureArgs:
    """One `configure` call, in either of the two accepted forms (see `parse_configure_args`).

    `address` is `store_addr` parsed, or None when the address was not checked
    (a group that never uses it).
    """

    store_addr: str
    address: StoreAddress | None
    rank: int
    world_size: int
    replica_id: str | None = None
    quorum_id: int | None = None
    group_rank: int | None = None
    group_world_size: int | None = None
    global_ranks: tuple[int, ...] | None = None


_TORCHFT_EXTRAS = ("quorum_id", "group_rank", "group_world_size", "global_ranks")


def parse_configure_args(
    args: tuple[Any, ...], kwargs: dict[str, Any], check_address: bool = True
) -> ConfigureArgs:
    """Read ``configure(store_addr, rank, world_size, replica_id=None)`` or torchft's
    ``configure(store_addr, replica_id, rank, world_size, quorum_id=None, group_rank=None,
    group_world_size=None, global_ranks=None)``; raise naming any bad value.

    The forms differ in the second positional argument: a replica id is a str.
    `global_ranks`, when given, numbers the members for ``src=``/``dst=``
    arguments instead of the numbering found at rendezvous.
    """
    names = (
        ("store_addr", "replica_id", "rank", "world_size")
        if len(args) >= 2 and isinstance(args[1], str)
        else ("store_addr", "rank", "world_size", "replica_id")
    )
    if len(args) > len(names) + len(_TORCHFT_EXTRAS):
        raise TypeError(f"configure() takes at most 8 arguments, got {len(args)}")
    values: dict[str, Any] = dict(zip(names + _TORCHFT_EXTRAS, args, strict=False))
    for key, value in kwargs.items():
        if key not in names + _TORCHFT_EXTRAS:
            raise TypeError(f"configure() got an unexpected keyword argument {key!r}")
        if key in values:
            raise TypeError(f"configure() got multiple values for argument {key!r}")
        values[key] = value
    missing = [n for n in ("store_addr", "rank", "world_size") if n not in values]
    if missing:
        raise TypeError(f"configure() is missing {', '.join(missing)}")
    store_addr, rank, world_size = values["store_addr"], values["rank"], values["world_size"]
    address = None
    if check_address:
        address = validate_configure_args(store_addr, rank, world_size)
    else:
        validate_rank_and_size(rank, world_size)
    replica_id = values.get("replica_id")
    if replica_id is not None and not isinstance(replica_id, str):
        raise TypeError(f"replica_id must be a str or None, got {replica_id!r}")
    global_ranks = values.get("global_ranks")
    if global_ranks is not None:
        global_ranks = tuple(global_ranks)
        if len(global_ranks) != world_size or len(set(global_ranks)) != world_size:
            raise ValueError(
                f"global_ranks must name {world_size} distinct ranks (one per member), "
                f"got {list(global_ranks)}"
            )
    return ConfigureArgs(
        store_addr=store_addr,
        address=address,
        rank=rank,
        world_size=world_size,
        replica_id=replica_id,
        quorum_id=values.get("quorum_id"),
        group_rank=values.get("group_rank"),
        group_world_size=values.get("group_world_size"),
        global_ranks=global_ranks,
    )


def own_global_rank() -> int:
    """This process's rank in the default group, or -1 without one."""
    if not dist.is_initialized():
        return -1
    try:
        return dist.get_rank()
    except (RuntimeError, ValueError):  # a default group being torn down
        return -1


def resolve_global_ranks(reported: list[int]) -> tuple[int, ...]:
    """Global ranks by group rank, from what each member reported at configure.

    Members that all belong to one default group (every report >= 0, no two
    alike) keep their default-group ranks, so ``src=``, ``dst=`` and
    ``dist.get_rank(group=pg)`` mean what they mean for any c10d group. Members
    of different jobs (equal reports) or without a default group (-1) have no
    common global numbering: global ranks are then the group ranks.
    """
    if all(r >= 0 for r in reported) and len(set(reported)) == len(reported):
        return tuple(reported)
    return tuple(range(len(reported)))


class ProcessGroup(BaseProcessGroup):
    """A c10d ProcessGroup that can be re-formed at run time with `configure`.

    Subclasses implement the collectives; every collective takes and returns the
    same types as c10d's (lists of tensors, option objects, a `Work`).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        # c10d's group tables answer for our groups from the first one on, not from import.
        _torch_internals.answer_for(ProcessGroup)
        super().__init__(0, 1)  # type: ignore[call-arg]  # c10d sees size 1; see module doc
        self._group_name: str | None = None
        self._registered: BaseProcessGroup | None = None
        self._global_ranks: tuple[int, ...] | None = None  # set by configure
        self._rank_table_cache: tuple[tuple[int, ...], dict[int, int]] | None = None
        self._keep_alive_on_destroy = False  # unregister() in progress: ignore c10d's shutdown()

    # -- lifecycle ---------------------------------------------------------------
    def configure(self, *args: Any, **kwargs: Any) -> None:
        """Form a new group: ``configure(store_addr, rank, world_size, replica_id=None)``.

        The group has `world_size` members rendezvousing at `store_addr`.
        Blocks until the new group is ready. Every call must get a unique
        ``host:port/prefix`` address. The old group, if any, is torn down.
        torchft's ``configure(store_addr, replica_id, rank, world_size, quorum_id=None,
        group_rank=None, group_world_size=None, global_ranks=None)`` is accepted too
        (see `parse_configure_args`).
        """
        raise NotImplementedError("configure")

    def abort(self, errored: bool = True) -> None:
        """Abort in-flight work and drop the group; idempotent. `configure` rebuilds it.

        `errored` (torchft's argument) says whether a failure caused the abort;
        either way in-flight work fails at once.
        """

    def shutdown(self) -> None:
        """Release sockets and child processes; idempotent and safe after a failure."""

    def errored(self) -> Exception | None:
        """The error that made this group unusable, or None."""
        return None

    def interrupt_configure(self, reason: str) -> None:
        """Make a `configure` in progress fail now (a member is known dead); default: no-op."""

    def wait_started(self, timeout: timedelta) -> None:
        """Block (at most `timeout`) until this group's own start-up is done.

        A group that joins a quorum before it can meet its peers makes every
        peer wait for it at the rendezvous (a Baby group's child imports torch:
        seconds); the Manager calls this before its replica group becomes
        visible to the lighthouse. Raises what the start-up raised. Default:
        nothing to wait for.
        """

    def num_active_work(self) -> int:
        """How many operations this group started that have not completed yet.

        Counts the works the caller still holds (a dropped work is not
        tracked); 0 for groups that complete every op at once.
        """
        return 0

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

        Creates a c10d group (on the default group's local rank) whose backend
        is this object, so ``_functional_collectives.all_reduce(t, "sum", pg)``
        and ``DeviceMesh.from_group`` resolve it. Needs ``init_process_group``.
        Its rank table stays this group's live one (see `_torch_internals.c10d_tables`).
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"register() needs a non-empty group name, got {name!r}")
        if not dist.is_initialized():
            raise RuntimeError(
                "register() needs torch.distributed.init_process_group() first: c10d "
                "groups are created relative to the default group"
            )
        if self._registered is not None and not _torch_internals.is_registered(self._registered):
            self._forget_registration()  # destroyed through dist.destroy_process_group
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
        _torch_internals.drop_rank_table(group)  # the size-1 view c10d stored: ours is live
        self._registered = group
        # With a factory that returns a ProcessGroup, c10d registers that object
        # itself and keeps its name only in its own table.
        name_in_c10d = _torch_internals.c10d_group_name(group)
        if group is self:
            _torch_internals.set_group_name(self, name_in_c10d)
        self._group_name = name_in_c10d
        registered: ProcessGroup = group
        return registered

    def unregister(self) -> None:
        """Remove the c10d registration made by `register`; idempotent.

        This group stays usable. (``dist.destroy_process_group(group)`` also
        works, and shuts the group down as c10d does for any group.)
        """
        group = self._registered
        if group is not None and dist.is_initialized() and _torch_internals.is_registered(group):
            self._keep_alive_on_destroy = True
            try:
                dist.destroy_process_group(group)  # reads group_name: clear it afterwards
            finally:
                self._keep_alive_on_destroy = False
        self._forget_registration()

    def _forget_registration(self) -> None:
        self._registered = None
        self._group_name = None

    @property
    def group_name(self) -> str:
        """The c10d name this PG is registered under (see `register`).

        An unregistered group answers a name no c10d lookup resolves, so a
        functional collective on it fails naming the group, and
        ``dist.destroy_process_group(pg)`` (which reads the name) works.
        """
        return self._c10d_name()

    # -- what c10d's tables answer for this group (see `_torch_internals.c10d_tables`)
    C10D_BACKEND = "torchft"  # what dist.get_backend(pg) reports; subclasses name theirs

    def _c10d_name(self) -> str:
        if self._group_name is not None:
            return self._group_name
        return f"torchft_pg-unregistered-{id(self):x}"

    def _c10d_backend(self) -> str:
        return self.C10D_BACKEND

    def global_ranks(self) -> tuple[int, ...]:
        """The global rank of each group rank: what ``src=``/``dst=`` arguments name.

        Set by each `configure` (see `resolve_global_ranks`); before the first,
        and for groups whose members do not share one default group, the
        global ranks are the group ranks.
        """
        ranks = self._global_ranks
        if ranks is None or len(ranks) != self.size():
            return tuple(range(self.size()))
        return ranks

    def _c10d_rank_table(self) -> dict[int, int]:
        ranks = self.global_ranks()
        table = self._rank_table_cache
        if table is None or table[0] != ranks:
            table = self._rank_table_cache = (ranks, {g: r for r, g in enumerate(ranks)})
        return dict(table[1])  # a copy: c10d callers may not change ours

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
