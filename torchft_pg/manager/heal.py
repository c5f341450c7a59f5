"""Heal: bring a replica that is behind up to the quorum's step from an up-to-date one.

The payload is ``{"user": {key: save()}, "torchft": {"step", "batches_committed"}}``:
every registered user state (model, optimizer, …) plus the Manager's own
counters, so a healed replica resumes at exactly the sender's committed step.
`Healer` moves it with a checkpoint transport (torchft's name for the
mechanism); the received user state is applied just before the commit vote.

A receive is measured (`Healer.last_received`): the bytes received, as the
transport counts them (`CheckpointTransport.received_bytes`) or else the
received state's tensor bytes, and the wall seconds of fetching and decoding
it. The Manager reports that to the lighthouse with its next quorum request,
for the dashboard's timeline and ``/metrics``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch

from lighthouse import ManagerClientProtocol, QuorumResult
from lighthouse.types import HealReport
from torchft_pg.checkpointing import CheckpointTransport
from torchft_pg.checkpointing.serialization import local_shard
from torchft_pg.errors import RecoveryError

__all__ = ["Healer", "ReadGate", "StateDictRegistry", "tensor_bytes"]


def tensor_bytes(state: Any) -> int:
    """Bytes of the tensor data in `state`: each tensor's elements times their
    size (a DTensor's local shard only: what a heal moves), found through nested
    dicts, lists and tuples; other values count nothing (a custom transport may
    return any object, and counting must never fail a heal)."""
    total = 0
    stack = [state]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            shard = local_shard(x)
            total += shard.numel() * shard.element_size()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


class ReadGate:
    """Lets heal sends read the user's state only while the user allows it.

    `disallow()` waits for a read in progress to finish and then blocks new
    ones until `allow()`; a reader waits at most its `timeout_s` seconds and
    then fails the heal (the step votes no) instead of stalling the job. Not
    tied to a thread: the training thread disallows, the quorum thread reads.
    A read is one `send_checkpoint`: over HTTP that is only the snapshot copy
    (receivers then stream the snapshot, never the live state), over a process
    group the whole push.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._allowed = True

    @property
    def allowed(self) -> bool:
        return self._allowed

    def allow(self) -> None:
        with self._cond:
            self._allowed = True
            self._cond.notify_all()

    def disallow(self) -> None:
        with self._cond:
            self._allowed = False
            self._cond.wait_for(lambda: self._readers == 0)

    @contextlib.contextmanager
    def reading(self, timeout_s: float) -> Iterator[None]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._allowed, timeout_s):
                raise RecoveryError(
                    f"state dict reads stayed disallowed for {timeout_s:.3f} s "
                    "(disallow_state_dict_read() without allow_state_dict_read())"
                )
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()


class StateDictRegistry:
    """Named (load, save) pairs for user state, and the heal payload built from them."""

    def __init__(self) -> None:
        self._fns: dict[str, tuple[Callable[[Any], None], Callable[[], Any]]] = {}
        self._lock = threading.Lock()

    def register(self, key: str, load: Callable[[Any], None], save: Callable[[], Any]) -> None:
        if not key or not isinstance(key, str):
            raise ValueError(f"state dict key must be a non-empty str, got {key!r}")
        if not callable(load) or not callable(save):
            raise TypeError(f"load and save for {key!r} must be callables")
        with self._lock:
            if key in self._fns:
                raise ValueError(f"a state dict function is already registered under {key!r}")
            self._fns[key] = (load, save)

    def keys(self) -> list[str]:
        return list(self._fns)

    def user_state(self) -> dict[str, Any]:
        """Every registered state as its save function returns it (live references)."""
        return {key: save() for key, (_, save) in self._fns.items()}

    def payload(self, manager_state: dict[str, int]) -> dict[str, Any]:
        """The state a healing peer receives, as live references: the transport
        copies (HTTP snapshot) or sends (PG push) them before `send_checkpoint` returns."""
        return {
            "user": self.user_state(),
            "torchft": dict(manager_state),
        }

    def apply(self, user_state: dict[str, Any]) -> None:
        """Load a received payload's user part through each registered load function."""
        missing = set(self._fns) - set(user_state)
        if missing:
            raise KeyError(
                f"healing payload lacks registered state {sorted(missing)}; has {sorted(user_state)}"
            )
        for key, (load, _) in self._fns.items():
            load(user_state[key])


class Healer:
    """One rank's side of healing: serve its state to healers, or receive it.

    `timeout` bounds each transfer and the wait for state reads to be allowed;
    `connect_manager` opens a client of a source's manager server (to ask its
    heal metadata when the quorum did not carry it).
    """

    def __init__(
        self,
        transport: CheckpointTransport[Any],
        connect_manager: Callable[[str], ManagerClientProtocol],
        group_rank: int,
        timeout: timedelta,
    ) -> None:
        self.transport = transport
        self.states = StateDictRegistry()
        self.reads = ReadGate()
        self._connect_manager = connect_manager
        self._group_rank = group_rank
        self._timeout = timeout
        self._pending: dict[str, Any] | None = None  # received user state, not yet applied
        self.last_received: HealReport | None = None  # what the latest receive moved

    def _name_quorum(self, result: QuorumResult) -> None:
        """Tell the transport which quorum this heal belongs to and this replica's rank
        in it, so a source serves only the healers that quorum named."""
        self.transport.set_quorum(f"{result.epoch}/{result.quorum_id}", result.replica_rank)

    def send(self, result: QuorumResult, counters: dict[str, int]) -> None:
        """Serve this replica's state at `result.max_step` to the replicas healing from it."""
        self._name_quorum(result)
        with self.reads.reading(self._timeout.total_seconds()):
            self.transport.send_checkpoint(
                result.recover_dst_replica_ranks,
                result.max_step,
                self.states.payload(counters),
                self._timeout,
            )

    def receive(self, result: QuorumResult) -> dict[str, int]:
        """Fetch the source's state for `result.max_step`; keep its user part for
        `apply_pending`, measure the transfer into `last_received` and return
        the Manager counters the state carried.

        The seconds measured span asking the source's metadata (if the quorum did
        not carry it), fetching and decoding the state: what healing cost before
        the step could go on; loading it into the model waits for the commit."""
        start = time.perf_counter()
        metadata = result.recover_src_checkpoint_metadata or self._ask_metadata(
            result.recover_src_manager_address
        )
        if result.recover_src_replica_rank is None:
            raise RecoveryError(f"the quorum names no heal source for step {result.max_step}")
        self._name_quorum(result)
        payload = self.transport.recv_checkpoint(
            result.recover_src_replica_rank, metadata, result.max_step, self._timeout
        )
        seconds = time.perf_counter() - start
        self._pending = payload["user"]
        counters: dict[str, int] = payload["torchft"]
        counted = self.transport.received_bytes()
        self.last_received = HealReport(
            step=result.max_step,
            bytes_received=counted if counted is not None else tensor_bytes(payload),
            transfer_s=seconds,
        )
        return counters

    def _ask_metadata(self, address: str) -> str:
        source = self._connect_manager(address)
        try:
            return source.checkpoint_metadata(self._group_rank, self._timeout)
        finally:
            source.close()

    def has_pending(self) -> bool:
        return self._pending is not None

    def drop_pending(self) -> None:
        """Forget a received state that will not be loaded (its step was not committed)."""
        self._pending = None

    def apply_pending(self) -> None:
        """Load the received user state through the registered load functions."""
        state, self._pending = self._pending, None
        if state is not None:
            self.states.apply(state)

    def shutdown(self, wait: bool = True) -> None:
        self.transport.shutdown(wait=wait)
