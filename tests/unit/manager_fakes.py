"""Fakes for the Manager's unit tests: a quorum client, a transport and a group.

No sockets: every result, vote and payload is what the test put there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future as ThreadFuture
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from lighthouse import FailureNotice, ManagerQuorumRequest, QuorumResult
from torchft_pg.checkpointing import CheckpointTransport
from torchft_pg.manager import Manager
from torchft_pg.process_group import ProcessGroupDummy
from torchft_pg.work import completed_work

STORE = "127.0.0.1:29500"


def result(
    quorum_id: int = 1,
    replica_rank: int = 0,
    world: int = 2,
    max_step: int = 0,
    max_rank: int | None = 0,
    max_world: int | None = None,
    heal: bool = False,
    src: int | None = None,
    dst: list[int] | None = None,
    epoch: str = "ep",
    src_metadata: str = "",
) -> QuorumResult:
    return QuorumResult(
        quorum_id=quorum_id,
        epoch=epoch,
        replica_rank=replica_rank,
        replica_world_size=world,
        recover_src_manager_address="127.0.0.1:1" if heal else "",
        recover_src_replica_rank=src,
        recover_dst_replica_ranks=dst or [],
        store_address=STORE,
        max_step=max_step,
        max_replica_rank=max_rank,
        max_world_size=world if max_world is None else max_world,
        heal=heal,
        replica_ids=[f"r{i}" for i in range(world)],
        recover_src_checkpoint_metadata=src_metadata,
    )


def _not_subscribed(notice: FailureNotice) -> None:
    raise AssertionError(f"no failure subscription to deliver {notice} to")


class FakeSubscription:
    """What `FakeClient.subscribe_failures` returns; the test calls the callback itself."""

    def __init__(self) -> None:
        self.cancelled = False

    def wait_ready(self, timeout: timedelta) -> bool:
        return True

    def cancel(self) -> None:
        self.cancelled = True


class FakeClient:
    """A `ManagerClientProtocol` answering from `results` and `decisions`; like the
    remote `ManagerClient`, `quorum_async` runs `quorum` on a thread of its own."""

    def __init__(
        self, results: list[QuorumResult], decisions: Sequence[bool | Exception] | None = None
    ) -> None:
        self.results = list(results)
        self.decisions = list(decisions) if decisions is not None else None
        self.requests: list[ManagerQuorumRequest] = []
        self.quorum_calls: list[dict[str, Any]] = []
        self.votes: list[tuple[int, bool]] = []
        self.failure_callback: Callable[[FailureNotice], None] = _not_subscribed
        self.quorum_error: Exception | None = None
        self.gate: threading.Event | None = None  # when set, quorum() waits for it
        self.closed = 0

    def quorum(self, request: ManagerQuorumRequest) -> QuorumResult:
        self.requests.append(request)
        self.quorum_calls.append(
            {
                "step": request.step,
                "commit_failures": request.commit_failures,
                "metadata": request.checkpoint_metadata,
            }
        )
        if self.gate is not None:
            assert self.gate.wait(5.0)
        if self.quorum_error is not None:
            raise self.quorum_error
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]

    def quorum_async(self, request: ManagerQuorumRequest) -> ThreadFuture[QuorumResult]:
        return self._answer_on_thread(request, "fake-client-call")

    def _answer_on_thread(
        self, request: ManagerQuorumRequest, thread_name: str
    ) -> ThreadFuture[QuorumResult]:
        out: ThreadFuture[QuorumResult] = ThreadFuture()

        def answer() -> None:
            try:
                out.set_result(self.quorum(request))
            except Exception as e:
                out.set_exception(e)

        threading.Thread(target=answer, name=thread_name, daemon=True).start()
        return out

    def checkpoint_metadata(self, rank: int, timeout: timedelta) -> str:
        return "fake://meta"

    def should_commit(
        self, group_rank: int, step: int, should_commit: bool, timeout: timedelta
    ) -> bool:
        self.votes.append((step, should_commit))
        if self.decisions is None:
            return should_commit
        decision = self.decisions.pop(0)
        if isinstance(decision, Exception):
            raise decision
        return decision

    def subscribe_failures(
        self,
        callback: Callable[[FailureNotice], None],
        group_rank: int = 0,
        on_error: Callable[[Exception], None] | None = None,
    ) -> FakeSubscription:
        self.failure_callback = callback
        return FakeSubscription()

    def close(self) -> None:
        self.closed += 1


class AsyncFakeClient(FakeClient):
    """Answers `quorum_async` from a thread named like the in-process manager
    server's loop, where rank 0's results arrive."""

    def quorum_async(self, request: ManagerQuorumRequest) -> ThreadFuture[QuorumResult]:
        return self._answer_on_thread(request, "fake-server-loop")


class FakeTransport(CheckpointTransport[Any]):
    def __init__(self, payload: dict[str, Any] | None = None) -> None:
        self.payload = payload
        self.sent: list[tuple[list[int], int, dict[str, Any]]] = []
        self.received: list[tuple[int, str, int]] = []
        self.disallowed = 0

    def metadata(self) -> str:
        return "fake://me"

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
    ) -> None:
        self.sent.append((dst_ranks, step, state_dict))

    def disallow_checkpoint(self) -> None:
        self.disallowed += 1

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.received.append((src_rank, metadata, step))
        assert self.payload is not None
        return self.payload

    def shutdown(self, wait: bool = True) -> None:
        pass


class HeldWork(Work):
    """A work whose future the test completes (or fails) by hand."""

    def __init__(self, fut: Future[Any]) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> Future[Any]:
        return self._fut


class SumGroup(ProcessGroupDummy):
    """Allreduce multiplies by the world size (every replica sent the same tensor);
    with `hold` set, allreduce futures (and those of the collectives of a
    quantized sum's reduce-scatter) stay pending until released. `ops` names
    every collective issued, in order."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self.configured: list[tuple[str, int, int]] = []
        self.configure_threads: list[str] = []
        self.hold = False
        self.pending: list[Future[Any]] = []
        self.held: list[list[torch.Tensor]] = []  # the tensors each held op writes
        self.aborted = 0
        self.ops: list[str] = []

    def _held(self, outputs: list[torch.Tensor]) -> Work:
        fut: Future[Any] = Future()
        self.pending.append(fut)
        self.held.append(outputs)
        return HeldWork(fut)

    def alltoall_base(  # type: ignore[override]
        self, output_buffer: torch.Tensor, input_buffer: torch.Tensor, *args: Any
    ) -> Work:
        self.ops.append("alltoall_base")
        if self.hold:
            return self._held([output_buffer])
        # every member sent the same: what each sends member 0 is our own first shard
        blocks = output_buffer.view(self._world, -1)
        blocks.copy_(input_buffer.view(self._world, -1)[self._rank].expand_as(blocks))
        return completed_work(output_buffer)

    def allgather_into_tensor_coalesced(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], *args: Any
    ) -> Work:
        self.ops.append("allgather_into_tensor_coalesced")
        if self.hold:
            return self._held(output_tensors)
        return super().allgather_into_tensor_coalesced(output_tensors, input_tensors, *args)

    def configure(
        self, store_addr: str, rank: int, world_size: int, replica_id: str | None = None
    ) -> None:
        self.configured.append((store_addr, rank, world_size))
        self.configure_threads.append(threading.current_thread().name)
        self._world = world_size

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        self.ops.append("allreduce")
        if self.hold:
            return self._held(tensors)
        for t in tensors:
            t.mul_(self._world)
        return completed_work(tensors)

    def abort(self, errored: bool = True) -> None:
        self.aborted += 1


def make(
    results: list[QuorumResult], **kwargs: Any
) -> tuple[Manager, FakeClient, FakeTransport, SumGroup]:
    client_type = kwargs.pop("client_type", FakeClient)
    client: FakeClient = client_type(results, kwargs.pop("decisions", None))
    transport = kwargs.pop("transport", FakeTransport())
    pg = SumGroup()
    manager = Manager(
        pg,
        client=client,  # where mypy checks FakeClient against ManagerClientProtocol
        connect_manager=kwargs.pop("connect_manager", lambda addr: client),
        checkpoint_transport=transport,
        min_replica_size=kwargs.pop("min_replica_size", 1),
        timeout=kwargs.pop("timeout", timedelta(seconds=5)),
        **kwargs,
    )
    return manager, client, transport, pg
