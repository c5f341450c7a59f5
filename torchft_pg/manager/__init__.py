"""`Manager`: the per-step fault-tolerance protocol of one rank (torchft's API).

Each step::

    manager.start_quorum()      # background: quorum RPC, reconfigure the PG, heal
    loss.backward()             # DDP's comm hook -> manager.allreduce(bucket)
    if manager.should_commit(): # every rank of every participating group voted yes
        optimizer.step()

A step counts only if every vote is yes; any failure in a step (collective,
PG, healing) turns this group's vote into no, the step is discarded
everywhere and the next quorum rebuilds the group. When the lighthouse reports
a dead peer, in-flight collectives are completed at once (their tensors left
as they were) instead of waiting for the collective timeout.

This package's face is the `Manager`, a facade over one module per concern.
The parts share one `step_state.StepState` (what the rank knows about its
step: quorum, participation, healing, the step's first failure, counters)
instead of calling back into the Manager:

* `quorum_round.QuorumRound` (+ `QuorumTimings`): the quorum request, its
  result, reconfiguring the process group and sequencing the heal;
  `quorum_plan.plan_quorum` (pure) says what a result asks of this rank;
* `gradient_sync.GradientSync`: `allreduce`, plain or quantized;
* `commit_vote.CommitVote`: `should_commit`;
* `integrity_check.IntegrityCheck`: every few steps, compare the state's
  fingerprints (`fingerprint`) across groups, judged by `state_verdict` (pure),
  and optionally the step's averaged gradients (`gradient_digests`);
* `step_counters.StepCounters` (pure): step, batches committed, failed
  commits, and how a vote moves them;
* `participation` (pure): who takes part and how votes count;
* `heal.Healer`: moving state to a replica that is behind;
* `notices.NoticeRouter`: the lighthouse's failure notices → the step they concern;
* `group_server` (rank 0 starts the group's manager server, every rank finds
  it) and `server_connection.ServerConnection` (connecting in the
  background, the notice subscription, closing);
* `config` (arguments and torchft's environment variables → typed settings),
  `waiting` (the stall warnings' cadence), `launcher_watch` (leave when
  torchrun dies).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import torch
from torch.distributed import ReduceOp, Work
from torch.futures import Future

from lighthouse import ManagerClient, ManagerClientProtocol
from torchft_pg._torch_internals import default_group_timeout
from torchft_pg.checkpointing import CheckpointTransport, HTTPTransport
from torchft_pg.errors import ExceptionWithTraceback
from torchft_pg.futures import ProxyFuture
from torchft_pg.manager.commit_vote import CommitVote
from torchft_pg.manager.config import (
    ManagerConfig,
    ManagerTimeouts,
    timeout_order_warnings,
    unsupported_variables,
)
from torchft_pg.manager.gradient_digests import check_gradients
from torchft_pg.manager.gradient_sync import GradientSync
from torchft_pg.manager.group_server import MANAGER_ADDR_KEY, REPLICA_ID_KEY
from torchft_pg.manager.heal import Healer
from torchft_pg.manager.integrity_check import DEFAULT_CHECK_EVERY, IntegrityCheck, check_every
from torchft_pg.manager.launcher_watch import should_watch, watch_launcher
from torchft_pg.manager.notices import NoticeRouter
from torchft_pg.manager.participation import WorldSizeMode
from torchft_pg.manager.quorum_round import QuorumRound, QuorumTimings
from torchft_pg.manager.server_connection import ServerConnection
from torchft_pg.manager.step_state import StepState
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.process_group.reconfigurable import ProcessGroupWrapper
from torchft_pg.quantization import Quantization

__all__ = ["MANAGER_ADDR_KEY", "REPLICA_ID_KEY", "Manager", "QuorumTimings", "WorldSizeMode"]
# WorldSizeMode (torchft_pg.manager.participation) and QuorumTimings (torchft_pg.manager.quorum_round)
# are re-exported here: torchft's import path.

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Manager:
    """Drives quorum, reconfiguration, healing and the commit vote for one rank.

    Timeouts (each a `timedelta` or a number of seconds): `timeout` bounds each
    collective, heal transfer and commit vote; `quorum_timeout` the quorum RPC;
    `connect_timeout` reaching a server. As in torchft, ``TORCHFT_TIMEOUT_SEC``,
    ``TORCHFT_QUORUM_TIMEOUT_SEC``, ``TORCHFT_CONNECT_TIMEOUT_SEC`` and
    ``TORCHFT_QUORUM_RETRIES`` override the arguments when set. A timeout that
    would make the wrong layer report a fault (see `config.timeout_order_warnings`)
    is named in a warning. `heartbeat_interval`: the period of the group's
    liveness pings to the lighthouse; by default a tenth of the lighthouse's
    heartbeat timeout, at least 100 ms (torchft pings every 100 ms whatever the
    timeout; each ping costs the lighthouse CPU).
    `integrity_check_every`: every this many committed steps (at each step
    whose quorum's max step is a multiple of it, and at each step some group
    heals, so that a joiner never keeps a corrupt source's state), the replica groups compare
    bit-exact fingerprints of their registered state (parameters, optimizer
    state; each rank its own shard) before the vote. A group whose state
    differs from a strict majority's votes no and heals from an up-to-date
    group at the next quorum; with no majority (e.g. two groups that differ)
    no group commits, and a WARNING says why. Default 100: silent data
    corruption is caught within 100 committed steps, for one fingerprint of
    the state per 100 steps; None or 0 turns the check off. See
    `integrity_check` and the operations guide.
    `integrity_check_gradients` (default False): at those same steps, also
    compare every result `allreduce` produced in the step (DDP's averaged
    gradient buckets, after the division: what the optimizer applies),
    bit-exactly, in call order. A group whose averaged gradient differs from
    the majority's received a corrupt reduction: it votes no on that step
    (its state is untouched) and heals at the next quorum, which the state
    check alone would see only after the corrupt gradient was applied, if at
    all. Cost: one read of each result at a checked step (a digest, like the
    state's, no copy) and a 4 KiB longer exchange; nothing on other steps.
    `set_integrity_check_gradients` changes it.
    `client` (this group's manager server), `connect_manager` (address ->
    client of a healing source's server), `checkpoint_transport` and `clock`
    can be injected: unit tests pass fakes, and then no server or store starts.

    Without an injected client the constructor only checks its arguments and
    returns; connecting (manager server, lighthouse, group store) runs in the
    background, and the first `start_quorum` waits for it and raises its error
    (e.g. `LighthouseUnavailableError` after `connect_timeout`). Connecting
    starts only once `pg` has started (`ProcessGroup.wait_started`, at most
    `connect_timeout`), so a group still starting is not yet a live replica
    its peers' quorums would wait for. Every client
    (`lighthouse.ManagerClientProtocol`) answers `quorum_async`; rank 0's
    in-process one answers on its server's loop, so a steady-state quorum
    finishes without a thread hop.
    """

    def __init__(
        self,
        pg: ProcessGroup,
        load_state_dict: Callable[[Any], None] | None = None,
        state_dict: Callable[[], Any] | None = None,
        min_replica_size: int = 1,
        use_async_quorum: bool = True,
        timeout: timedelta | float = timedelta(seconds=60),
        quorum_timeout: timedelta | float = timedelta(seconds=60),
        connect_timeout: timedelta | float = timedelta(seconds=60),
        rank: int | None = None,
        world_size: int | None = None,
        world_size_mode: WorldSizeMode = WorldSizeMode.DYNAMIC,
        store_addr: str | None = None,
        store_port: int | None = None,
        lighthouse_addr: str | None = None,
        replica_id: str | None = None,
        port: int | None = None,
        hostname: str | None = None,
        heartbeat_interval: timedelta | None = None,
        checkpoint_transport: CheckpointTransport[Any] | None = None,
        init_sync: bool = True,
        max_retries: int | None = None,
        quorum_retries: int = 0,
        client: ManagerClientProtocol | None = None,
        connect_manager: Callable[[str], ManagerClientProtocol] | None = None,
        clock: Callable[[], float] = time.monotonic,
        integrity_check_every: int | None = DEFAULT_CHECK_EVERY,
        integrity_check_gradients: bool = False,
    ) -> None:
        if min_replica_size < 1:
            raise ValueError(f"min_replica_size must be >= 1, got {min_replica_size}")
        if max_retries is not None and max_retries < 0:
            raise ValueError(f"max_retries must be >= 0 or None, got {max_retries}")
        integrity_every = check_every(integrity_check_every)
        integrity_gradients = check_gradients(integrity_check_gradients)
        timeouts = ManagerTimeouts.resolve(
            timeout=timeout,
            quorum_timeout=quorum_timeout,
            connect_timeout=connect_timeout,
            quorum_retries=quorum_retries,
        )
        timeout, quorum_timeout = timeouts.timeout, timeouts.quorum_timeout
        connect_timeout, quorum_retries = timeouts.connect_timeout, timeouts.quorum_retries
        for line in unsupported_variables() + timeout_order_warnings(
            timeout=timeout,
            quorum_timeout=quorum_timeout,
            pg_timeout=pg.timeout if isinstance(pg, ProcessGroupWrapper) else None,
            group_timeout=default_group_timeout(),
        ):
            logger.warning("Manager: %s", line)
        self._pg = pg
        self.timeouts = timeouts  # what the arguments and torchft's variables resolved to
        self._use_async_quorum = use_async_quorum  # read by semisync.diloco too
        self._timeout = timeout
        self._quorum_timeout = quorum_timeout
        self._connect_manager = connect_manager or (
            lambda addr: ManagerClient(addr, connect_timeout)
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchft_pg-quorum")
        config: ManagerConfig | None = None
        if client is None:
            if should_watch():  # under torchrun: leave the job if torchrun dies
                watch_launcher()
            config = ManagerConfig.from_env(
                lighthouse_addr=lighthouse_addr,
                rank=rank,
                world_size=world_size,
                store_addr=store_addr,
                store_port=store_port,
                replica_id=replica_id,
                port=port,
                hostname=hostname,
            )
            hostname = config.hostname
            group_rank = config.rank
            replica_id = config.replica_id  # gets its incarnation suffix once connected
        else:
            group_rank = rank if rank is not None else 0
            replica_id = replica_id or "replica"
        self._state = StepState(group_rank=group_rank, replica_id=replica_id)
        self._notices = NoticeRouter(pg, self._state)
        self._healer = Healer(
            checkpoint_transport
            or HTTPTransport(
                timeout,
                # TORCHFT_BIND_HOST (config) places the heal server; default: every
                # interface with a job secret, loopback without (lighthouse.exposure)
                bind_host=(config.bind_host if config and config.bind_host else None),
                advertise_host=hostname,
            ),
            self._connect_manager,
            group_rank,
            timeout,
        )
        if load_state_dict is not None and state_dict is not None:
            self._healer.states.register("default", load_state_dict, state_dict)
        self._connection = ServerConnection(state=self._state, pg=pg, notices=self._notices)
        self._counters = self._state.counters
        self._round = QuorumRound(
            state=self._state,
            pg=pg,
            notices=self._notices,
            healer=self._healer,
            connection=self._connection,
            executor=self._executor,
            use_async_quorum=use_async_quorum,
            world_size_mode=world_size_mode,
            min_replica_size=min_replica_size,
            init_sync=init_sync,
            clock=clock,
        )
        self._integrity = IntegrityCheck(
            state=self._state,
            pg=pg,
            notices=self._notices,
            healer=self._healer,
            every=integrity_every,
            timeout=timeout,
            gradients=integrity_gradients,
        )
        self._gradients = GradientSync(
            state=self._state,
            pg=pg,
            notices=self._notices,
            round=self._round,
            timeout=timeout,
            clock=clock,
            digests=self._integrity.gradient_digests,
        )
        self._vote = CommitVote(
            state=self._state,
            pg=pg,
            notices=self._notices,
            round=self._round,
            integrity=self._integrity,
            connection=self._connection,
            min_replica_size=min_replica_size,
            max_retries=max_retries,
            timeout=timeout,
            clock=clock,
        )
        # Connecting last: failure notices may arrive as soon as it subscribes.
        if config is not None:
            self._connection.start(
                self._executor, config, heartbeat_interval, connect_timeout, quorum_retries
            )
        else:
            assert client is not None
            self._connection.use(client)

    @property
    def replica_id(self) -> str:
        """This replica group's id (with its incarnation suffix once connected)."""
        return self._state.replica_id

    @replica_id.setter
    def replica_id(self, replica_id: str) -> None:
        self._state.replica_id = replica_id

    # -- per-step protocol -------------------------------------------------------
    def start_quorum(
        self, allow_heal: bool = True, shrink_only: bool = False, timeout: timedelta | None = None
    ) -> None:
        """Start this step's quorum in the background (healing too, if `allow_heal`).

        Re-raises a failure of the previous quorum (e.g. QuorumTimeoutError).
        """
        self._round.wait_previous()
        self._integrity.gradient_digests.begin_step()
        self._round.start(allow_heal, shrink_only, timeout or self._quorum_timeout)
        if not self._use_async_quorum:
            self.wait_quorum()
            self._round.apply_pending_state()

    def wait_quorum(self) -> None:
        """Block until this step's quorum (and any reconfiguration) is done."""
        self._round.wait()

    def allreduce(
        self,
        tensor: torch.Tensor,
        should_quantize: bool = False,
        reduce_op: ReduceOp | ReduceOp.RedOpType = ReduceOp.AVG,
        *,
        quantization: Quantization | str = Quantization.INT8,
        private_copy: bool = True,
    ) -> Work:
        """Allreduce `tensor` across participating replicas; never raises on a failure.

        AVG divides by the number of participants (floating tensors only); a
        healing or spare replica contributes zeros. On any failure the tensor
        is left as is, the error is reported and this step's vote becomes no.

        `should_quantize`: send each contribution as `quantization` ("int8"
        with per-chunk scales, or "bf16"; see `torchft_pg.quantization`) and
        sum in float32; SUM or AVG of floating tensors only. Bad arguments
        raise ValueError at once.

        `private_copy` (default True): the backend reduces a copy of `tensor`,
        and the result reaches `tensor` only if the op succeeds, so an op a
        failure abandoned (which may still complete later in a retired
        backend) never writes into memory the caller reuses. False reduces
        `tensor` in place (plain, unquantized ops), one pass over it fewer:
        only for a caller that stops using `tensor`'s memory after an op whose
        work did not succeed (``ManagedWork.succeeded``), as our DDP does by
        replacing its buckets.
        """
        return self._gradients.allreduce(
            tensor, should_quantize, reduce_op, quantization, private_copy=private_copy
        )

    def should_commit(self, timeout: timedelta | None = None) -> bool:
        """Vote on this step with every rank of the group; True means apply it.

        Must be called by every group rank once per step. Raises
        CommitFailedError after more than `max_retries` failed commits in a row.
        """
        return self._vote.should_commit(timeout)

    def set_integrity_check_every(self, every: int | None) -> None:
        """Change `integrity_check_every` (None or 0: no checks). LocalSGD and
        DiLoCo turn the check off: between their syncs each replica group trains
        on its own, so their groups' states legitimately differ."""
        self._integrity.every = check_every(every)

    def set_integrity_check_gradients(self, on: bool) -> None:
        """Change `integrity_check_gradients` (True: compare the averaged gradients
        at each integrity check) from the next `start_quorum` on. Every replica group
        should hold the same setting: a group with it off takes no part in the
        gradients' comparison (it still meets the others in the exchange)."""
        self._integrity.gradient_digests.enabled = check_gradients(on)

    # -- errors ------------------------------------------------------------------
    def report_error(self, e: Exception) -> None:
        """Mark this step failed: later allreduces are skipped and the vote is no."""
        self._state.report_error(e)

    def errored(self) -> ExceptionWithTraceback | None:
        """This step's first failure (the error is its `original_exception`), or None."""
        return self._state.errored()

    def wrap_future(
        self, fut: Future[T], default: T, timeout: timedelta | None = None
    ) -> Future[T]:
        """`fut`, but an error or timeout yields `default` and is reported instead."""
        return ProxyFuture(fut, default, self.report_error, timeout or self._timeout).future

    # -- accessors ---------------------------------------------------------------
    @property
    def pg(self) -> ProcessGroup:
        return self._pg

    def current_step(self) -> int:
        return self._counters.current_step()

    def batches_committed(self) -> int:
        return self._counters.batches_committed

    def num_participants(self) -> int:
        if self._round.started:
            self.wait_quorum()
        return self._state.participation.world_size

    def participating_rank(self) -> int | None:
        if self._round.started:
            self.wait_quorum()
        return self._state.participation.rank

    def is_participating(self) -> bool:
        return self.participating_rank() is not None and not self._state.healing

    def quorum_id(self) -> tuple[str, int]:
        """(epoch, quorum id) of the group this rank is configured for."""
        return self._state.epoch, self._state.quorum_id

    def register_state_dict_fn(
        self, key: str, load_state_dict: Callable[[T], None], state_dict: Callable[[], T]
    ) -> None:
        """Register user state (model, optimizer, …) that healing transfers under `key`."""
        self._healer.states.register(key, load_state_dict, state_dict)

    def set_state_dict_fns(
        self, load_state_dict: Callable[[T], None], state_dict: Callable[[], T]
    ) -> None:
        """Deprecated torchft spelling of ``register_state_dict_fn("default", ...)``."""
        self._healer.states.register("default", load_state_dict, state_dict)

    def disallow_state_dict_read(self) -> None:
        """Keep heal sends off the registered state until `allow_state_dict_read`.

        Call it before mutating that state outside the optimizer step (LocalSGD
        and DiLoCo do, around their parameter updates). Waits for a send that is
        reading it now; a send that starts meanwhile waits up to `timeout`, then
        fails its heal. Idempotent.
        """
        self._healer.reads.disallow()

    def allow_state_dict_read(self) -> None:
        """Let heal sends read the registered state again. Idempotent."""
        self._healer.reads.allow()

    def state_dict(self) -> dict[str, int]:
        """The Manager's own state; checkpoint it with the model."""
        return self._counters.state_dict()

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Restore the counters `state_dict()` returned (torchft's argument name).

        Raises ``ValueError`` naming the counter if one is not an int in
        [0, 2**63) (the wire's int64), so a bad checkpoint fails here rather
        than at the next quorum.
        """
        self._counters.load_state_dict(state_dict)

    def last_quorum_timings(self) -> QuorumTimings | None:
        """Where the last finished `start_quorum` spent its time (None before one)."""
        return self._round.timings

    def shutdown(self, wait: bool = True) -> None:
        """Stop background work, the transport, the PG and (rank 0) the manager server."""
        self._connection.stop_notices()
        self._executor.shutdown(wait=wait)
        self._healer.shutdown(wait=wait)
        self._pg.shutdown()
        self._connection.close()
