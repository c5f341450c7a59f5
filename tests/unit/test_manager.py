"""The Manager's per-step protocol with injected fakes: no sockets, no patching."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import ReduceOp, Work
from torch.futures import Future

from lighthouse import FailureNotice, QuorumTimeoutError
from tests.unit.manager_fakes import (
    STORE,
    AsyncFakeClient,
    FakeClient,
    FakeTransport,
    SumGroup,
    make,
    result,
)
from torchft_pg.errors import CommitFailedError, ExceptionWithTraceback
from torchft_pg.manager import Manager, WorldSizeMode


@pytest.mark.parametrize("client_type", [FakeClient, AsyncFakeClient])
def test_happy_path_averages_commits_and_reconfigures_only_on_new_quorum(
    client_type: type[FakeClient],
) -> None:
    manager, client, transport, pg = make(
        [result(quorum_id=1), result(quorum_id=1), result(quorum_id=2, world=3)],
        client_type=client_type,
    )
    for expected_world in (2, 2, 3):
        manager.start_quorum()
        t = torch.ones(2)
        manager.allreduce(t).wait()
        assert t.tolist() == [1.0, 1.0]  # SUM over the world, then / participants
        assert manager.should_commit()
        assert manager.num_participants() == expected_world
    assert manager.current_step() == 3 and manager.batches_committed() == 2 + 2 + 3
    assert pg.configured == [(f"{STORE}/torchft/ep/1/0", 0, 2), (f"{STORE}/torchft/ep/2/0", 0, 3)]
    # a reconfiguration blocks, so it never runs where quorum results arrive
    assert all(name.startswith("torchft_pg-quorum") for name in pg.configure_threads)
    assert [c["step"] for c in client.quorum_calls] == [0, 1, 2]
    assert transport.disallowed == 3
    manager.shutdown()


@pytest.mark.parametrize("client_type", [FakeClient, AsyncFakeClient])
def test_quorum_timings_split_the_wait_the_configure_and_the_heal(
    client_type: type[FakeClient],
) -> None:
    payload = {"user": {}, "torchft": {"step": 3, "batches_committed": 3}}
    manager, *_ = make(
        [
            result(quorum_id=1, max_step=3, max_rank=None, max_world=1, heal=True, src=1),
            result(quorum_id=1, max_step=4),
        ],
        client_type=client_type,
        transport=FakeTransport(payload),
    )
    assert manager.last_quorum_timings() is None
    manager.start_quorum()
    assert manager.should_commit()  # an asynchronous quorum heals at the vote
    first = manager.last_quorum_timings()
    assert first is not None and first.quorum_s > 0 and first.configure_s > 0 and first.heal_s > 0
    manager.start_quorum()
    manager.wait_quorum()
    steady = manager.last_quorum_timings()
    assert steady is not None and steady.quorum_s > 0
    assert (steady.configure_s, steady.heal_s) == (0.0, 0.0)  # same quorum, nobody heals
    manager.shutdown()


def test_sum_is_not_divided_and_int_avg_is_refused() -> None:
    manager, *_ = make([result()])
    manager.start_quorum()
    t = torch.ones(1)
    manager.allreduce(t, reduce_op=ReduceOp.SUM).wait()
    assert t.item() == 2.0
    with pytest.raises(ValueError, match=r"floating tensor, got dtype torch\.int64"):
        manager.allreduce(torch.ones(1, dtype=torch.int64))
    manager.shutdown()


@pytest.mark.parametrize("client_type", [FakeClient, AsyncFakeClient])
def test_healing_replica_contributes_zeros_loads_state_and_jumps_to_max_step(
    client_type: type[FakeClient],
) -> None:
    loaded: list[Any] = []
    payload = {
        "user": {"default": {"w": torch.tensor([7.0])}},
        "torchft": {"step": 20, "batches_committed": 40},
    }
    manager, _, transport, _ = make(
        [result(replica_rank=0, max_step=20, max_rank=None, max_world=1, heal=True, src=1)],
        transport=FakeTransport(payload),
        client_type=client_type,
    )
    manager.register_state_dict_fn("default", loaded.append, lambda: {"w": torch.zeros(1)})
    manager.start_quorum()
    grad = torch.full((1,), 5.0)
    manager.allreduce(grad).wait()
    assert grad.item() == 0.0  # zeros from a healer (then SUM=0, /1 participant)
    assert not manager.is_participating()
    assert manager.should_commit()
    assert loaded and loaded[0]["w"].item() == 7.0
    assert transport.received == [(1, "fake://meta", 20)]
    assert manager.current_step() == 21 and manager.batches_committed() == 41
    manager.shutdown()


def test_a_heal_the_group_does_not_commit_leaves_the_step_where_the_quorum_found_it() -> None:
    # In a multi-rank group another rank's heal may fail: every rank votes on
    # the step it asked a quorum for, and healed counters apply only on a commit.
    payload = {
        "user": {"default": {"w": torch.tensor([7.0])}},
        "torchft": {"step": 20, "batches_committed": 40},
    }
    manager, client, _, _ = make(
        [result(replica_rank=0, max_step=20, max_rank=None, max_world=1, heal=True, src=1)],
        transport=FakeTransport(payload),
        decisions=[False],
    )
    manager.register_state_dict_fn("default", lambda sd: None, lambda: {"w": torch.zeros(1)})
    manager.start_quorum()
    manager.wait_quorum()
    assert manager.current_step() == 20  # what the step runs as, once healed
    assert manager.should_commit() is False
    assert client.votes == [(0, True)]  # for step 0, the step it asked a quorum for
    assert manager.current_step() == 0 and manager.batches_committed() == 0
    manager.shutdown()


def test_a_healer_uses_the_metadata_the_quorum_carried_without_calling_the_source() -> None:
    def no_call(addr: str) -> Any:
        raise AssertionError(f"connected to {addr} although the quorum carried the metadata")

    payload = {"user": {}, "torchft": {"step": 20, "batches_committed": 40}}
    manager, _, transport, _ = make(
        [result(max_step=20, max_rank=None, max_world=1, heal=True, src=1, src_metadata="q://m")],
        transport=FakeTransport(payload),
        connect_manager=no_call,
    )
    manager.start_quorum()
    assert manager.should_commit()
    assert transport.received == [(1, "q://m", 20)]
    manager.shutdown()


def test_source_serves_user_state_and_counters() -> None:
    manager, _, transport, _ = make([result(dst=[1])])
    manager.register_state_dict_fn("model", lambda s: None, lambda: {"w": 1})
    manager.start_quorum()
    manager.wait_quorum()
    assert transport.sent == []  # nothing read while the step's forward may run
    assert manager.should_commit()
    dst, step, payload = transport.sent[0]
    assert dst == [1] and step == 0
    assert payload == {"user": {"model": {"w": 1}}, "torchft": {"step": 0, "batches_committed": 0}}
    manager.shutdown()


def test_failed_commit_is_counted_sent_to_the_lighthouse_and_bounded() -> None:
    manager, client, _, _ = make([result()], decisions=[False, False, False], max_retries=1)
    manager.start_quorum()
    assert manager.should_commit() is False
    manager.start_quorum()
    manager.wait_quorum()
    assert client.quorum_calls[-1]["commit_failures"] == 1
    with pytest.raises(CommitFailedError, match="2 commits failed in a row"):
        manager.should_commit()
    manager.shutdown()


def test_collective_error_makes_the_vote_no_and_later_allreduces_no_ops() -> None:
    manager, client, _, pg = make([result()])
    manager.start_quorum()
    pg.hold = True
    t = torch.ones(1)
    work = manager.allreduce(t)
    pg.pending[0].set_exception(RuntimeError("Connection closed by peer"))
    assert work.get_future().wait() is t and t.item() == 1.0  # untouched, not raised
    errored = manager.errored()
    assert isinstance(errored, ExceptionWithTraceback)
    assert isinstance(errored.original_exception, RuntimeError)
    assert "Connection closed by peer" in str(errored) and errored.stack_trace
    skipped = torch.ones(1)
    manager.allreduce(skipped).wait()
    assert len(pg.pending) == 1 and skipped.item() == 1.0
    assert manager.should_commit() is False and client.votes[-1] == (0, False)
    manager.shutdown()


def test_failure_notice_aborts_inflight_collectives_at_once() -> None:
    manager, client, _, pg = make([result(world=3)])
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True
    t = torch.full((1,), 4.0)
    work = manager.allreduce(t)
    done = threading.Event()
    work.get_future().add_done_callback(lambda _: done.set())
    assert not done.is_set()
    client.failure_callback(
        FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), reason="stream closed")
    )
    assert done.wait(1.0)  # completed by the notice, not by the 5 s timeout
    assert t.item() == 4.0 and pg.aborted == 1
    assert "r2" in str(manager.errored())
    # A notice about another quorum, or about a non-member, changes nothing.
    manager.start_quorum()
    manager.wait_quorum()
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=0, dead_replica_ids=("r1",)))
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("stranger",)))
    assert manager.errored() is None and pg.aborted == 1
    manager.shutdown()


def test_an_abandoned_allreduce_that_completes_later_writes_nothing_the_caller_sees() -> None:
    # After a failure notice the backend's op may still run to the end in the
    # retired backend (a frozen peer resumed): its result must land nowhere the
    # caller reuses, such as DDP's bucket of a later step.
    manager, client, _, pg = make([result(world=3)])
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True
    t = torch.full((2,), 4.0)
    work = manager.allreduce(t)
    client.failure_callback(
        FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), reason="frozen")
    )
    assert work.get_future().wait() is t
    [written] = pg.held
    assert written[0] is not t  # the backend reduces a copy
    written[0].fill_(99.0)  # the abandoned op finishes now
    pg.pending[0].set_result(written)
    assert t.tolist() == [4.0, 4.0]
    # Nor is its buffer handed to a later op: only a completed op's is reused.
    manager.start_quorum()
    manager.wait_quorum()
    manager.allreduce(torch.full((2,), 1.0))
    assert pg.held[-1][0].data_ptr() != written[0].data_ptr()
    manager.shutdown()


def test_a_completed_allreduces_private_copy_is_reused_by_the_next() -> None:
    manager, _, _, pg = make([result(world=2)])
    manager.start_quorum()
    pg.hold = True
    first = torch.full((4,), 3.0)
    manager.allreduce(first)
    [written] = pg.held
    pg.pending[0].set_result(written)
    second = torch.full((4,), 7.0)
    manager.allreduce(second)
    reused = pg.held[-1][0]
    assert reused.data_ptr() == written[0].data_ptr()
    assert reused.tolist() == [7.0] * 4  # a fresh copy of the new tensor
    manager.shutdown()


def test_a_completed_allreduce_reaches_the_callers_tensor_averaged() -> None:
    manager, _, _, pg = make([result(world=2)])
    manager.start_quorum()
    pg.hold = True
    t = torch.full((2,), 3.0)
    work = manager.allreduce(t)
    [written] = pg.held
    written[0].fill_(10.0)  # the sum over both participants
    pg.pending[0].set_result(written)
    assert work.get_future().wait() is t
    assert t.tolist() == [5.0, 5.0]
    manager.shutdown()


def test_an_average_is_one_division_of_the_sum_in_the_tensors_dtype() -> None:
    # the same bits as sum / participants (not sum * (1 / participants)), for
    # float32 and for a narrower dtype the backend sums in
    for dtype in (torch.float32, torch.bfloat16):
        manager, _, _, pg = make([result(world=3)])
        manager.start_quorum()
        pg.hold = True
        t = torch.zeros(3, dtype=dtype)
        work = manager.allreduce(t)
        [written] = pg.held
        sums = torch.tensor([10.0, 1.0, 7.1], dtype=dtype)
        written[0].copy_(sums)
        pg.pending[0].set_result(written)
        assert work.get_future().wait() is t
        assert torch.equal(t, sums / 3), (dtype, t, sums / 3)
        manager.shutdown()


def test_late_notice_about_the_old_quorum_does_not_poison_the_next_step() -> None:
    manager, client, _, pg = make([result(quorum_id=1, world=3), result(quorum_id=2, world=2)])
    manager.start_quorum()
    manager.wait_quorum()
    manager.should_commit()
    client.gate = threading.Event()
    manager.start_quorum()  # quorum 2 is still forming: the lighthouse already dropped r2
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    assert manager.errored() is None and pg.aborted == 0
    client.gate.set()
    t = torch.ones(1)
    manager.allreduce(t).wait()
    assert t.item() == 1.0 and manager.should_commit()  # took part on quorum 2
    manager.shutdown()


def test_notice_arriving_while_a_leased_round_forms_fails_that_steps_collectives() -> None:
    # a round answered from a quorum lease keeps the quorum id: a death notice
    # that raced with it concerns the step it starts, whose first collective fails it
    manager, client, _, pg = make([result(quorum_id=1, world=3), result(quorum_id=1, world=3)])
    manager.start_quorum()
    manager.wait_quorum()
    assert manager.should_commit()
    client.gate = threading.Event()
    manager.start_quorum()
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    assert manager.errored() is None and pg.aborted == 0  # held until the quorum is taken
    client.gate.set()
    manager.wait_quorum()
    assert pg.aborted == 1  # applied once the quorum was taken
    issued = len(pg.ops)
    t = torch.ones(1)
    manager.allreduce(t).wait()
    assert len(pg.ops) == issued and t.item() == 1.0  # not issued with a member declared dead
    assert "r2" in str(manager.errored())
    assert manager.should_commit() is False
    manager.shutdown()


def test_a_death_notice_after_the_steps_collectives_completed_leaves_the_step_to_its_vote() -> None:
    """The member the lighthouse declares dead took part in every collective of
    the step that completed. It may be alive, cut off only from the lighthouse,
    and commit that step on its lease: failing it here would make the next
    quorum run the step again without it, and the job's history would fork."""
    manager, client, _, pg = make([result(quorum_id=1, world=3), result(quorum_id=2, world=2)])
    manager.start_quorum()
    manager.wait_quorum()
    t = torch.ones(1)
    manager.allreduce(t).wait()
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    assert pg.aborted == 1  # nothing more runs with it
    assert manager.errored() is None
    assert manager.should_commit() is True
    assert manager.current_step() == 1
    manager.start_quorum()  # the next step is on the quorum without it
    manager.wait_quorum()
    t = torch.ones(1)
    manager.allreduce(t).wait()
    assert manager.errored() is None and manager.should_commit() is True
    manager.shutdown()


def test_a_collective_running_at_a_death_notice_that_completes_in_its_grace_commits() -> None:
    manager, client, _, pg = make([result(quorum_id=1, world=3)], timeout=timedelta(seconds=60))
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True
    t = torch.ones(1)
    work = manager.allreduce(t)
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    assert pg.aborted == 0 and manager.errored() is None  # it still runs: the grace
    pg.pending[0].set_result([pg.held[0][0].mul_(3)])  # every member's part arrived
    work.wait()
    assert t.item() == 1.0  # the average of three ones
    assert manager.should_commit() is True
    manager.shutdown()


def test_a_collective_still_running_after_its_grace_fails_the_step() -> None:
    manager, client, _, pg = make([result(quorum_id=1, world=3)], timeout=timedelta(seconds=60))
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True  # the op never completes on its own: the member really is gone
    t = torch.full((1,), 5.0)
    work = manager.allreduce(t)
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    started = time.monotonic()
    work.get_future().wait()
    waited = time.monotonic() - started
    assert waited < 30, "the op waited for its 60 s timeout, not the notice's grace"
    assert t.item() == 5.0  # left as it was
    assert "r2" in str(manager.errored()) and pg.aborted == 1
    assert manager.should_commit() is False
    manager.shutdown()


def test_a_notice_applied_while_an_op_is_issued_completes_that_op_at_once() -> None:
    """The notice fails the step and aborts the group between the op's issue and its
    tracking: the op (stranded in the retired backend) must not hold the step
    until the collective timeout, but complete at once like the ones in flight."""
    manager, client, _, pg = make([result(quorum_id=1, world=3)], timeout=timedelta(seconds=60))
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True  # the op never completes on its own
    plain_allreduce = pg.allreduce

    def racing(tensors: list[torch.Tensor], opts: Any = None) -> Work:
        work = plain_allreduce(tensors, opts)
        client.failure_callback(
            FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), step=0)
        )
        return work

    pg.allreduce = racing  # type: ignore[method-assign]
    done = threading.Event()

    def step() -> None:
        manager.allreduce(torch.ones(1)).get_future().wait()
        done.set()

    threading.Thread(target=step, daemon=True).start()
    assert done.wait(5.0), "the op waited for its 60 s timeout"
    assert "left the lease at step 0" in str(manager.errored()) and pg.aborted == 1
    assert manager.should_commit() is False
    manager.shutdown()


def test_step_scoped_notice_fails_only_that_step() -> None:
    manager, client, _, pg = make([result(quorum_id=1, world=3)] * 3)
    manager.start_quorum()
    manager.wait_quorum()
    assert manager.should_commit()  # step 0 committed: now at step 1
    manager.start_quorum()
    manager.wait_quorum()
    late = FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), step=0)
    client.failure_callback(late)  # about a step already committed
    assert manager.errored() is None and pg.aborted == 0
    client.failure_callback(
        FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), step=1)
    )
    assert pg.aborted == 1
    manager.allreduce(torch.ones(1)).wait()  # refused: the step's collectives are fenced
    assert "left the lease at step 1" in str(manager.errored())
    assert manager.should_commit() is False
    manager.shutdown()


class BlockingConfigureGroup(SumGroup):
    """configure() waits like a real rendezvous until interrupt_configure()."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = threading.Event()
        self.entered = threading.Event()

    def configure(
        self, store_addr: str, rank: int, world_size: int, replica_id: str | None = None
    ) -> None:
        self.entered.set()
        if self.interrupted.wait(5.0):
            raise RuntimeError("configure interrupted")
        super().configure(store_addr, rank, world_size)

    def interrupt_configure(self, reason: str) -> None:
        self.interrupted.set()


def test_failure_notice_interrupts_the_configure_of_that_quorum() -> None:
    client = FakeClient([result(quorum_id=1, world=3)])
    pg = BlockingConfigureGroup()
    manager = Manager(
        pg, client=client, checkpoint_transport=FakeTransport(), timeout=timedelta(seconds=5)
    )
    manager.start_quorum()
    assert pg.entered.wait(5.0)
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    manager.wait_quorum()  # returns at once, not after the 5 s rendezvous
    assert "interrupted" in str(manager.errored())
    assert manager.should_commit() is False
    manager.shutdown()


def test_no_collective_is_issued_on_a_group_whose_configure_a_notice_interrupted() -> None:
    """The allreduce waits for the round, which a notice ended in a failed configure:
    the op must not reach the group (torn down, or still the previous quorum's)."""
    client = FakeClient([result(quorum_id=1, world=3)])
    pg = BlockingConfigureGroup()
    issued: list[int] = []
    plain_allreduce = pg.allreduce

    def counting(tensors: list[torch.Tensor], opts: Any = None) -> Work:
        issued.append(len(tensors))
        return plain_allreduce(tensors, opts)

    pg.allreduce = counting  # type: ignore[method-assign]
    manager = Manager(
        pg, client=client, checkpoint_transport=FakeTransport(), timeout=timedelta(seconds=5)
    )
    manager.start_quorum()
    assert pg.entered.wait(5.0)
    t = torch.ones(1)
    done = threading.Event()
    result_box: list[torch.Tensor] = []

    def step() -> None:
        result_box.append(manager.allreduce(t).get_future().wait())
        done.set()

    worker = threading.Thread(target=step)
    worker.start()  # waits for the round, in the configure
    client.failure_callback(FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",)))
    assert done.wait(5.0)
    worker.join(5.0)
    assert issued == [] and result_box == [t] and t.item() == 1.0
    assert manager.should_commit() is False
    manager.shutdown()


def test_collective_timeout_is_reported_not_hung() -> None:
    client = FakeClient([result()])
    pg = SumGroup()
    manager = Manager(
        pg, client=client, checkpoint_transport=FakeTransport(), timeout=timedelta(milliseconds=50)
    )
    manager.start_quorum()
    pg.hold = True
    t = torch.ones(1)
    assert manager.allreduce(t).get_future().wait() is t
    assert "did not finish within" in str(manager.errored())
    manager.shutdown()


def test_quorum_timeout_votes_no_then_raises_at_next_start() -> None:
    manager, client, _, _ = make([result()])
    client.quorum_error = QuorumTimeoutError("no quorum containing r0 within 0:00:01")
    manager.start_quorum()
    assert manager.should_commit() is False
    with pytest.raises(QuorumTimeoutError, match="no quorum"):
        manager.start_quorum()
    manager.shutdown()


def test_fixed_with_spares_zeroes_spares_and_counts_min_replicas() -> None:
    manager, *_ = make(
        [result(replica_rank=2, world=3, max_rank=2)],
        min_replica_size=2,
        world_size_mode=WorldSizeMode.FIXED_WITH_SPARES,
    )
    manager.start_quorum()
    t = torch.ones(1)
    manager.allreduce(t).wait()
    assert manager.num_participants() == 2 and manager.participating_rank() is None
    assert t.item() == 0.0
    assert manager.should_commit()
    assert manager.batches_committed() == 2
    manager.shutdown()


def test_sync_quorum_heals_before_the_step_and_participates() -> None:
    loaded: list[Any] = []
    payload = {"user": {"default": 1}, "torchft": {"step": 3, "batches_committed": 6}}
    manager, *_ = make(
        [result(replica_rank=1, max_step=3, max_rank=None, max_world=1, heal=True, src=0)],
        transport=FakeTransport(payload),
        use_async_quorum=False,
    )
    manager.register_state_dict_fn("default", loaded.append, lambda: 0)
    manager.start_quorum()
    assert loaded == [1]  # applied before forward
    assert manager.is_participating() and manager.num_participants() == 2
    manager.shutdown()


def test_wrap_future_substitutes_default_and_reports() -> None:
    manager, *_ = make([result()])
    fut: Future[Any] = Future()  # torch's stub types set_exception's argument as the value type
    wrapped = manager.wrap_future(fut, 42)
    fut.set_exception(RuntimeError("boom"))
    assert wrapped.wait() == 42 and "boom" in str(manager.errored())
    manager.shutdown()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_replica_size must be >= 1, got 0"):
        Manager(
            SumGroup(),
            client=FakeClient([result()]),
            checkpoint_transport=FakeTransport(),
            min_replica_size=0,
        )
    manager, *_ = make([result()])
    manager.register_state_dict_fn("a", lambda s: None, lambda: 1)
    with pytest.raises(ValueError, match="already registered under 'a'"):
        manager.register_state_dict_fn("a", lambda s: None, lambda: 1)
    manager.shutdown()


def test_the_request_reports_the_steps_own_work_apart_from_its_wait_for_peers() -> None:
    """busy_ms = step time less the wait of the step's last allreduce (submit to
    completion): what tells a straggler when every group's step time is alike."""
    now = [0.0]
    manager, client, _, pg = make([result(quorum_id=1)], clock=lambda: now[0])
    manager.start_quorum()
    assert client.requests[-1].busy_ms == 0.0  # no step measured yet
    manager.wait_quorum()
    pg.hold = True
    now[0] = 0.010
    first = manager.allreduce(torch.ones(1))
    pg.pending[0].set_result([torch.ones(1)])  # an early bucket, overlapped with work
    first.wait()
    now[0] = 0.030  # 30 ms of work, then the last bucket waits 70 ms for the peers
    last = manager.allreduce(torch.ones(1))
    now[0] = 0.100
    pg.pending[1].set_result([torch.ones(1)])
    last.wait()
    assert manager.should_commit()
    now[0] = 0.110
    manager.start_quorum()
    request = client.requests[-1]
    assert request.step_time_ms == pytest.approx(110.0)
    assert request.busy_ms == pytest.approx(40.0)
    manager.shutdown()


def test_a_late_notice_about_a_failed_attempt_does_not_fail_its_retry_in_a_new_quorum() -> None:
    # The lighthouse may send a second recall about step s of quorum 1 after the
    # group voted no on it. The retry of step s has the same step number, and its
    # quorum view is quorum 1 until the new quorum (2) is taken: a notice arriving
    # as the retry begins is held and, once quorum 2 is taken, dropped.
    manager, client, _, _ = make([result(quorum_id=1, world=3), result(quorum_id=2, world=3)])
    try:
        manager.start_quorum()
        manager.wait_quorum()
        manager._state.report_error(RuntimeError("attempt 1 failed"))
        assert manager.should_commit() is False
        step = manager.current_step()
        late = FailureNotice(
            epoch="ep", quorum_id=1, dead_replica_ids=("r2",), reason="lease recalled", step=step
        )
        begin_step = manager._state.begin_step

        def begin_then_notice() -> None:  # the notice arrives as the retry starts
            begin_step()
            client.failure_callback(late)

        manager._state.begin_step = begin_then_notice  # type: ignore[method-assign]
        manager.start_quorum()
        manager.wait_quorum()
        assert manager.quorum_id()[1] == 2
        assert manager.errored() is None
        assert manager.should_commit() is True
        assert manager.current_step() == step + 1
    finally:
        manager.shutdown()
