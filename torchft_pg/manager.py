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

The Manager sequences the step; the rest lives beside it: who takes part and
how votes count (`participation`, pure), moving state to a replica that is
behind (`heal`), and routing the lighthouse's failure notices (`notices`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
from torch._C._distributed_c10d import AllgatherOptions, ReduceOp, Work
from torch.futures import Future

from lighthouse import (
    ManagerClient,
    ManagerClientProtocol,
    ManagerQuorumRequest,
    ManagerServer,
    QuorumRejectedError,
    QuorumResult,
)
from lighthouse.types import HealReport
from torchft_pg.checkpointing import CheckpointTransport, HTTPTransport
from torchft_pg.config import ManagerConfig
from torchft_pg.errors import CommitFailedError, ExceptionWithTraceback, RecoveryError
from torchft_pg.futures import ProxyFuture
from torchft_pg.heal import Healer
from torchft_pg.manager_setup import MANAGER_ADDR_KEY, REPLICA_ID_KEY, connect_replica_group
from torchft_pg.notices import NoticeRouter, StepView
from torchft_pg.participation import (
    NOT_STARTED,
    Participation,
    WorldSizeMode,
    local_vote,
    participation,
)
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.quantization import Quantization, encode, sum_encoded
from torchft_pg.work import ManagedWork, completed_work

__all__ = ["MANAGER_ADDR_KEY", "REPLICA_ID_KEY", "Manager", "QuorumTimings", "WorldSizeMode"]
# WorldSizeMode is defined in torchft_pg.participation and re-exported here (torchft's path).

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class QuorumTimings:
    """Where one `start_quorum` went, in seconds.

    `quorum_s`: from the request to the result (includes waiting for the
    other replicas to reach their step boundary); `configure_s`: rebuilding
    the process group (0 when the quorum did not change); `heal_s`: sending
    or receiving the state (0 when nobody healed).
    """

    quorum_s: float
    configure_s: float = 0.0
    heal_s: float = 0.0


class Manager:
    """Drives quorum, reconfiguration, healing and the commit vote for one rank.

    Timeouts: `timeout` bounds each collective, heal transfer and commit vote;
    `quorum_timeout` the quorum RPC; `connect_timeout` reaching a server.
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
        timeout: timedelta = timedelta(seconds=60),
        quorum_timeout: timedelta = timedelta(seconds=60),
        connect_timeout: timedelta = timedelta(seconds=60),
        rank: int | None = None,
        world_size: int | None = None,
        world_size_mode: WorldSizeMode = WorldSizeMode.DYNAMIC,
        store_addr: str | None = None,
        store_port: int | None = None,
        lighthouse_addr: str | None = None,
        replica_id: str | None = None,
        port: int | None = None,
        hostname: str | None = None,
        heartbeat_interval: timedelta = timedelta(milliseconds=100),
        checkpoint_transport: CheckpointTransport[Any] | None = None,
        init_sync: bool = True,
        max_retries: int | None = None,
        quorum_retries: int = 0,
        client: ManagerClientProtocol | None = None,
        connect_manager: Callable[[str], ManagerClientProtocol] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_replica_size < 1:
            raise ValueError(f"min_replica_size must be >= 1, got {min_replica_size}")
        if max_retries is not None and max_retries < 0:
            raise ValueError(f"max_retries must be >= 0 or None, got {max_retries}")
        self._pg = pg
        self._min_replica_size = min_replica_size
        self._use_async_quorum = use_async_quorum
        self._timeout = timeout
        self._quorum_timeout = quorum_timeout
        self._connect_timeout = connect_timeout
        self._world_size_mode = world_size_mode
        self._init_sync = init_sync
        self._max_retries = max_retries
        self._clock = clock
        # The group and the quorum id it is recorded under change together, under this lock.
        self._pg_lock = threading.Lock()
        self._notices = NoticeRouter(pg, self.report_error, self._step_view, self._pg_lock)
        self._server: ManagerServer | None = None
        self._client: ManagerClientProtocol | None = None  # set once connected
        self._subscription: Any = None
        self._connect_manager = connect_manager or (
            lambda addr: ManagerClient(addr, self._connect_timeout)
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchft_pg-quorum")
        self._connected: ThreadFuture[None] | None = None
        if client is None:
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
            self._group_rank, self._group_world_size = config.rank, config.world_size
            self.replica_id = config.replica_id  # gets its incarnation suffix once connected
            # Connecting (manager server, lighthouse link, group store) runs on the
            # quorum thread, overlapping whatever the caller does before its first
            # start_quorum; that call (or any other needing it) waits for it and
            # raises its error, e.g. LighthouseUnavailableError.
            self._connected = self._executor.submit(
                self._connect, config, heartbeat_interval, quorum_retries
            )
        else:
            self._group_rank = rank if rank is not None else 0
            self._group_world_size = world_size if world_size is not None else 1
            self.replica_id = replica_id or "replica"
            self._use_client(client)
        self._healer = Healer(
            checkpoint_transport or HTTPTransport(timeout, advertise_host=hostname),
            self._connect_manager,
            self._group_rank,
            timeout,
        )
        if load_state_dict is not None and state_dict is not None:
            self._healer.states.register("default", load_state_dict, state_dict)
        self._quorum_future: ThreadFuture[None] | None = None

        self._step = 0
        # The counters a heal received, applied only when the step commits: in a
        # multi-rank group one rank's heal may fail while another's succeeds, and
        # every rank must still vote on the same step (the one it asked a quorum
        # for); the group's vote is then no and nobody's step moves.
        self._healed_counters: dict[str, int] | None = None
        self._quorum_step = 0  # the step this rank sent with its last quorum request
        self._batches_committed = 0
        self._commit_failures = 0
        self._epoch = ""
        self._quorum_id = -1
        self._participants: frozenset[str] = frozenset()
        self._participation: Participation = NOT_STARTED
        self._healing = False
        self._errored: ExceptionWithTraceback | None = None
        self._last_start: float | None = None
        self._quorum_requested = 0.0
        self._timings: QuorumTimings | None = None
        self._step_time_ms = 0.0
        # What this rank's latest heal moved, for the lighthouse: sent once, with
        # the next quorum request (None: nothing to report).
        self._heal_report: HealReport | None = None

    # -- start-up ----------------------------------------------------------------
    def _connect(self, config: ManagerConfig, heartbeat_interval: timedelta, retries: int) -> None:
        # Not visible to the lighthouse before the group can meet its peers: a
        # replica that asks for a quorum (or is merely live) while its group still
        # starts (a Baby child importing torch) stalls every peer's next step.
        try:
            self._pg.wait_started(self._connect_timeout)
        except Exception as e:  # the first configure starts afresh and reports its own error
            logger.warning("replica %s: process group start-up failed: %s", self.replica_id, e)
        client, self.replica_id, self._server = connect_replica_group(
            config, config.hostname, heartbeat_interval, self._connect_timeout, retries
        )
        self._use_client(client)

    def _use_client(self, client: ManagerClientProtocol) -> None:
        self._client = client
        self._subscription = client.subscribe_failures(
            self._notices.on_notice, group_rank=self._group_rank, on_error=self._on_watch_error
        )

    def _wait_connected(self) -> ManagerClientProtocol:
        """Raise the start-up connection's error, or return the client once it is done."""
        if self._connected is not None:
            self._connected.result()
        assert self._client is not None  # set by _use_client before _connected completes
        return self._client

    # -- per-step protocol -------------------------------------------------------
    def start_quorum(
        self, allow_heal: bool = True, shrink_only: bool = False, timeout: timedelta | None = None
    ) -> None:
        """Start this step's quorum in the background (healing too, if `allow_heal`).

        Re-raises a failure of the previous quorum (e.g. QuorumTimeoutError).
        """
        if self._quorum_future is not None:
            self._quorum_future.result()
        now = self._clock()
        if self._last_start is not None:
            self._step_time_ms = (now - self._last_start) * 1000.0
        self._last_start = now
        self._errored = None
        self._healing = False
        self._healed_counters = None
        self._quorum_step = self._step
        self._notices.quorum_requested()
        timeout = timeout or self._quorum_timeout
        client = self._wait_connected()
        self._quorum_requested = time.perf_counter()
        done: ThreadFuture[None] = ThreadFuture()
        self._quorum_future = done
        request = self._quorum_request(shrink_only, timeout)
        try:
            pending = client.quorum_async(request)
        except Exception as e:
            done.set_exception(e)
        else:
            pending.add_done_callback(
                lambda f: self._on_quorum_result(f, done, allow_heal, timeout)
            )
        if not self._use_async_quorum:
            self.wait_quorum()
            self._apply_pending_state()

    def wait_quorum(self) -> None:
        """Block until this step's quorum (and any reconfiguration) is done."""
        assert self._quorum_future is not None, "call start_quorum() first"
        self._quorum_future.result()

    def _quorum_request(self, shrink_only: bool, timeout: timedelta) -> ManagerQuorumRequest:
        """This rank's request for this step's quorum, waiting up to `timeout`.
        It carries the latest heal's report, which is then cleared (sent once)."""
        heal, self._heal_report = self._heal_report, None
        return ManagerQuorumRequest(
            group_rank=self._group_rank,
            step=self._step,
            checkpoint_metadata=self._healer.transport.metadata(),
            timeout=timeout,
            shrink_only=shrink_only,
            init_sync=self._init_sync,
            commit_failures=self._commit_failures,
            step_time_ms=self._step_time_ms,
            heal=heal,
        )

    def _on_quorum_result(
        self,
        pending: ThreadFuture[QuorumResult],
        done: ThreadFuture[None],
        allow_heal: bool,
        timeout: timedelta,
    ) -> None:
        """Runs where the result arrives: the manager server's loop for rank 0's
        in-process client, else the remote client's worker thread. In the
        steady state (same quorum, nothing to heal) the step's quorum is
        finished right there; a reconfiguration or heal, which block, go to the
        quorum thread."""
        try:
            result = pending.result()
        except BaseException as e:
            self._notices.quorum_failed()
            done.set_exception(e)
            return
        steady = (result.epoch, result.quorum_id) == (self._epoch, self._quorum_id) and not (
            allow_heal and (result.heal or result.recover_dst_replica_ranks)
        )

        def finish() -> None:
            try:
                self._finish_quorum(result, allow_heal, timeout)
            except BaseException as e:
                self._notices.quorum_failed()
                done.set_exception(e)
            else:
                # Held notices take effect before the quorum is seen as taken, so a
                # caller of wait_quorum() never sees a step the notice should fail.
                # Under the lock: a notice arriving meanwhile is held, then applied.
                with self._pg_lock:
                    self._notices.quorum_taken_locked()
                    done.set_result(None)

        if steady:
            finish()
            return
        try:
            self._executor.submit(finish)
        except RuntimeError as e:  # shut down meanwhile
            done.set_exception(e)

    def _finish_quorum(self, result: QuorumResult, allow_heal: bool, timeout: timedelta) -> None:
        """Take this step's ranks from `result`; reconfigure the PG on a new quorum
        and heal (send or receive the state) if `allow_heal`."""
        quorum_s = time.perf_counter() - self._quorum_requested
        configure_s = self._take_quorum(result, allow_heal)
        heal_s = 0.0
        if (
            configure_s is not None
            and allow_heal
            and (result.heal or result.recover_dst_replica_ranks)
        ):
            start = time.perf_counter()
            self._heal(result, timeout)
            heal_s = time.perf_counter() - start
        self._timings = QuorumTimings(quorum_s, configure_s or 0.0, heal_s)

    def _take_quorum(self, result: QuorumResult, allow_heal: bool) -> float | None:
        """This step's ranks from `result`; on a new quorum, reconfigure the PG.
        Returns the seconds spent reconfiguring (0.0 for the same quorum), None
        if it failed (reported: this step votes no)."""
        self._participation = participation(
            result,
            heals_in_background=self._use_async_quorum or not allow_heal,
            mode=self._world_size_mode,
            min_replica_size=self._min_replica_size,
        )

        if (result.epoch, result.quorum_id) != (self._epoch, self._quorum_id):
            addr = f"{result.store_address}/torchft/{result.epoch}/{result.quorum_id}/{self._group_rank}"
            logger.info(
                "%s new quorum %s/%s: %d replicas %s, reconfiguring at %s",
                self._tag(),
                result.epoch,
                result.quorum_id,
                result.replica_world_size,
                result.replica_ids,
                addr,
            )
            members = frozenset(result.replica_ids)
            start = time.perf_counter()
            try:
                with (
                    self._notices.configuring(result.epoch, result.quorum_id, members),
                    self._pg_lock,
                ):
                    self._pg.configure(addr, result.replica_rank, result.replica_world_size)
                    self._epoch, self._quorum_id = result.epoch, result.quorum_id
                    self._participants = members
            except Exception as e:
                self.report_error(e)
                return None
            return time.perf_counter() - start
        return 0.0

    def _heal(self, result: QuorumResult, timeout: timedelta) -> None:
        try:
            if result.recover_dst_replica_ranks:
                self._healer.send(result, self._counters())
            if result.heal:
                self._healing = True
                start = time.perf_counter()
                self._healed_counters = self._checked_counters(self._healer.receive(result))
                self._heal_report = self._healer.last_received
                logger.info(
                    "%s healed to step %d from replica rank %s in %.3f s (%s bytes)",
                    self._tag(),
                    self.current_step(),
                    result.recover_src_replica_rank,
                    time.perf_counter() - start,
                    None if self._heal_report is None else self._heal_report.bytes_received,
                )
        except Exception as e:
            self.report_error(RecoveryError(f"healing at step {result.max_step} failed: {e}"))

    def _apply_pending_state(self) -> None:
        if self._healer.has_pending():
            try:
                self._healer.apply_pending()
            except Exception as e:
                self.report_error(RecoveryError(f"applying the healed state failed: {e}"))
            self._healing = False

    def allreduce(
        self,
        tensor: torch.Tensor,
        should_quantize: bool = False,
        reduce_op: ReduceOp | ReduceOp.RedOpType = ReduceOp.AVG,
        *,
        quantization: Quantization | str = Quantization.INT8,
    ) -> Work:
        """Allreduce `tensor` across participating replicas; never raises on a failure.

        AVG divides by the number of participants (floating tensors only); a
        healing or spare replica contributes zeros. On any failure the tensor
        is left as is, the error is reported and this step's vote becomes no.

        `should_quantize`: send each contribution as `quantization` ("int8"
        with per-chunk scales, or "bf16"; see `torchft_pg.quantization`) and
        sum in float32; SUM or AVG of floating tensors only. Bad arguments
        raise ValueError at once.
        """
        average = reduce_op == ReduceOp.AVG
        if average and not tensor.is_floating_point():
            raise ValueError(f"AVG allreduce needs a floating tensor, got dtype {tensor.dtype}")
        scheme = Quantization.parse(quantization) if should_quantize else None
        if scheme is not None and not (average or reduce_op == ReduceOp.SUM):
            raise ValueError(f"a quantized allreduce sums or averages, got reduce_op {reduce_op}")
        if scheme is not None and not tensor.is_floating_point():
            raise ValueError(f"a quantized allreduce needs a floating tensor, got {tensor.dtype}")
        if self._errored is not None:
            return completed_work(tensor)
        try:
            self.wait_quorum()
            # The backend reduces a private copy: an op a failure notice abandoned
            # may still complete later in the retired backend, and must then write
            # into nothing the caller reuses (DDP's buckets are reused every step).
            # The result reaches `tensor` only through `finish`, which an abort skips.
            private = tensor.clone() if self.is_participating() else torch.zeros_like(tensor)
            divisor = max(self.num_participants(), 1)
            if scheme is not None:
                work, reduced = self._quantized_sum(private, scheme)
            else:
                op = ReduceOp(ReduceOp.SUM) if average else reduce_op
                if not isinstance(op, ReduceOp):  # a RedOpType; c10d also passes ReduceOp
                    op = ReduceOp(op)
                work = self._pg.allreduce([private], op)

                def reduced() -> torch.Tensor:
                    return private  # the op wrote it in place

            source = work.get_future()
        except Exception as e:
            self.report_error(e)
            return completed_work(tensor)

        def finish(_: Any) -> torch.Tensor:
            tensor.copy_(reduced())
            return tensor.div_(divisor) if average else tensor

        proxy: ProxyFuture[torch.Tensor] = ProxyFuture(
            source, tensor, self.report_error, self._timeout, finish
        )
        self._notices.track(proxy)
        errored = self._errored
        if errored is not None:  # a failure notice raced with our submit
            proxy.abort(errored.original_exception)
        return ManagedWork(proxy)

    def _quantized_sum(
        self, contribution: torch.Tensor, scheme: Quantization
    ) -> tuple[Work, Callable[[], torch.Tensor]]:
        """Allgather every member's encoded `contribution`; once done, the float32 sum
        (shaped like it), added in rank order so that every member gets the same bits."""
        encoded = encode(contribution, scheme)
        gathered = [torch.empty_like(encoded) for _ in range(self._pg.size())]
        work = self._pg.allgather([gathered], [encoded], AllgatherOptions())

        def total() -> torch.Tensor:
            return sum_encoded(gathered, contribution.numel(), scheme).view(contribution.shape)

        return work, total

    def should_commit(self, timeout: timedelta | None = None) -> bool:
        """Vote on this step with every rank of the group; True means apply it.

        Must be called by every group rank once per step. Raises
        CommitFailedError after more than `max_retries` failed commits in a row.
        """
        try:
            self.wait_quorum()
        except Exception as e:
            self.report_error(e)
        # the step's collectives nobody waited on (e.g. per-parameter hooks) end first
        self._notices.wait_inflight(self._timeout.total_seconds())
        pg_error = self._pg.errored()
        if pg_error is not None:
            self.report_error(pg_error)
        participants = self._participation.world_size if self._errored is None else 0
        vote = local_vote(
            failed=self._errored is not None,
            participants=participants,
            min_replica_size=self._min_replica_size,
        )
        client = self._wait_connected()
        try:
            decision = client.should_commit(
                self._group_rank, self._quorum_step, vote, timeout or self._timeout
            )
        except QuorumRejectedError as e:
            # The server refused this vote (late, stale or abandoned): the group
            # decided this attempt without it, and a decision needs every rank's
            # yes, so it was no. A timeout, by contrast, leaves the decision
            # unknown to this rank and is raised.
            self.report_error(e)
            decision = False
        self._healer.transport.disallow_checkpoint()
        healed, self._healed_counters = self._healed_counters, None
        # A healed state is loaded only once the group has committed: in a multi-rank
        # group another rank's heal may have failed, and a rank that loaded the
        # source's state while its step stays put would train the next step on a
        # state its group never committed to.
        if decision and self._healer.has_pending():
            try:
                self._healer.apply_pending()
            except Exception as e:  # the group committed: this rank cannot follow it
                raise RecoveryError(
                    f"{self._tag()} the group committed a healed step but loading the "
                    f"healed state here failed: {e}"
                ) from e
        self._healer.drop_pending()
        self._healing = False
        if decision and healed is not None:
            self._step, self._batches_committed = healed["step"], healed["batches_committed"]
        if decision:
            self._step += 1
            self._batches_committed += participants
            self._commit_failures = 0
        else:
            self._commit_failures += 1
        logger.info(
            "%s %s (vote %s, %d participants, last step %.1f ms, error: %s)",
            self._tag(),
            "committed" if decision else "discarded",
            vote,
            participants,
            self._step_time_ms,
            self._errored,
        )
        if (
            not decision
            and self._max_retries is not None
            and self._commit_failures > self._max_retries
        ):
            raise CommitFailedError(
                f"{self._commit_failures} commits failed in a row (max_retries={self._max_retries})"
            )
        return decision

    # -- errors ------------------------------------------------------------------
    def report_error(self, e: Exception) -> None:
        """Mark this step failed: later allreduces are skipped and the vote is no."""
        if self._errored is None:
            self._errored = (
                e if isinstance(e, ExceptionWithTraceback) else ExceptionWithTraceback(e)
            )
            logger.warning("%s step failed: %s: %s", self._tag(), type(e).__name__, e)

    def errored(self) -> ExceptionWithTraceback | None:
        """This step's first failure (the error is its `original_exception`), or None."""
        return self._errored

    def wrap_future(
        self, fut: Future[T], default: T, timeout: timedelta | None = None
    ) -> Future[T]:
        """`fut`, but an error or timeout yields `default` and is reported instead."""
        return ProxyFuture(fut, default, self.report_error, timeout or self._timeout).future

    def _step_view(self) -> StepView:
        """What failure notices are compared with (read under `_pg_lock`)."""
        return StepView(
            epoch=self._epoch,
            quorum_id=self._quorum_id,
            participants=self._participants,
            step=self.current_step(),
        )

    def _on_watch_error(self, e: Exception) -> None:
        logger.warning("%s failure-notice stream broke: %s", self._tag(), e)

    # -- accessors ---------------------------------------------------------------
    @property
    def pg(self) -> ProcessGroup:
        return self._pg

    def current_step(self) -> int:
        healed = self._healed_counters
        return self._step if healed is None else healed["step"]

    def batches_committed(self) -> int:
        return self._batches_committed

    def num_participants(self) -> int:
        if self._quorum_future is not None:
            self.wait_quorum()
        return self._participation.world_size

    def participating_rank(self) -> int | None:
        if self._quorum_future is not None:
            self.wait_quorum()
        return self._participation.rank

    def is_participating(self) -> bool:
        return self.participating_rank() is not None and not self._healing

    def quorum_id(self) -> tuple[str, int]:
        """(epoch, quorum id) of the group this rank is configured for."""
        return self._epoch, self._quorum_id

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

    def _counters(self) -> dict[str, int]:
        return {"step": self._step, "batches_committed": self._batches_committed}

    def state_dict(self) -> dict[str, int]:
        """The Manager's own state; checkpoint it with the model."""
        return self._counters()

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Restore the counters `state_dict()` returned (torchft's argument name).

        Raises ``ValueError`` naming the counter if one is not an int in
        [0, 2**63) (the wire's int64), so a bad checkpoint fails here rather
        than at the next quorum.
        """
        counters = self._checked_counters(state_dict)
        self._step = counters["step"]
        self._batches_committed = counters["batches_committed"]

    @staticmethod
    def _checked_counters(state_dict: dict[str, int]) -> dict[str, int]:
        counters = {}
        for key in ("step", "batches_committed"):
            value = state_dict[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise ValueError(
                    f"load_state_dict: {key} must be an int >= 0 and < 2**63, got {value!r}"
                )
            counters[key] = value
        return counters

    def last_quorum_timings(self) -> QuorumTimings | None:
        """Where the last finished `start_quorum` spent its time (None before one)."""
        return self._timings

    def _tag(self) -> str:
        return f"[replica {self.replica_id} rank {self._group_rank} step {self._step} quorum {self._epoch}/{self._quorum_id}]"

    def shutdown(self, wait: bool = True) -> None:
        """Stop background work, the transport, the PG and (rank 0) the manager server."""
        if self._connected is not None:  # a server still starting would outlive us
            with contextlib.suppress(Exception):  # one that never came up needs no stop
                self._connected.result()
        if self._subscription is not None:
            self._subscription.cancel()
        self._executor.shutdown(wait=wait)
        self._healer.shutdown(wait=wait)
        self._pg.shutdown()
        if self._server is not None:
            self._server.shutdown()
        if self._client is not None:  # None if connecting failed
            self._client.close()
