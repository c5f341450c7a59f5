"""Our own per-operation deadline (NCCL's, instead of c10d's watchdog) and the
flight-recorder trigger an abort pulls. CPU only: the GPU side is in
tests/integration/test_pg_nccl.py."""

from __future__ import annotations

import os
import select
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]
from torch.futures import Future

from torchft_pg.process_group import _flight_recorder
from torchft_pg.process_group._deadlines import bound_by_deadline
from torchft_pg.process_group.nccl import c10d_backstop

SHORT = timedelta(milliseconds=50)


def test_an_operation_that_overstays_its_deadline_is_expired_once() -> None:
    fut: Future[list[torch.Tensor]] = Future()
    expired = threading.Event()
    calls: list[int] = []

    def expire() -> None:
        calls.append(1)
        expired.set()

    work = _create_work_from_future(fut)
    assert bound_by_deadline(work, SHORT, expire) is work
    assert expired.wait(10.0)
    fut.set_result([torch.ones(1)])  # completing late changes nothing
    assert calls == [1]


def test_an_operation_that_completes_in_time_is_never_expired() -> None:
    fut: Future[list[torch.Tensor]] = Future()
    expired = threading.Event()
    bound_by_deadline(_create_work_from_future(fut), timedelta(milliseconds=300), expired.set)
    fut.set_result([torch.ones(1)])
    assert not expired.wait(0.6)


def test_c10ds_own_timeout_never_fires_before_ours() -> None:
    for seconds in (1, 10, 60, 3600):
        ours = timedelta(seconds=seconds)
        assert c10d_backstop(ours) >= ours + timedelta(minutes=10)


def test_the_flight_recorder_is_asked_through_c10ds_pipe_and_its_dump_awaited(
    tmp_path: Path,
) -> None:
    pipe_prefix, dump_prefix = str(tmp_path / "pipe_"), str(tmp_path / "fr_")
    pipe = f"{pipe_prefix}3.pipe"
    os.mkfifo(pipe)
    env = {
        _flight_recorder.TRIGGER_ENV: "true",
        _flight_recorder.PIPE_ENV: pipe_prefix,
        _flight_recorder.DUMP_ENV: dump_prefix,
    }
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # c10d's end of its debug pipe
    result: list[Path | None] = []
    trigger = threading.Thread(
        target=lambda: result.append(_flight_recorder.trigger_dump(3, env, wait_s=10.0))
    )
    try:
        trigger.start()
        readable, _, _ = select.select([reader], [], [], 10.0)
        assert readable, "nothing was written to the pipe"
        assert os.read(reader, 16) == b"1\n"
        Path(f"{dump_prefix}3").write_bytes(b"trace")  # c10d writes its dump
        trigger.join(timeout=10.0)
    finally:
        os.close(reader)
    assert result == [Path(f"{dump_prefix}3")]


def test_without_a_reader_or_a_pipe_the_trigger_returns_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p0.pipe")
    env = {_flight_recorder.PIPE_ENV: str(tmp_path / "p")}
    assert _flight_recorder.trigger_dump(0, env, wait_s=30.0) is None  # ENXIO, no block
    assert _flight_recorder.trigger_dump(0, {}, wait_s=30.0) is None


@pytest.mark.parametrize(
    ("value", "on"), [("true", True), ("1", True), ("false", False), ("", False)]
)
def test_torchfts_switch(value: str, on: bool) -> None:
    assert _flight_recorder.enabled({_flight_recorder.TRIGGER_ENV: value}) is on


def test_each_quorum_dumps_into_a_directory_of_its_own() -> None:
    assert _flight_recorder.dump_path_for("/tmp/fr", "torchft/ab12/7/0") == "/tmp/fr_quorum_ab12_7/"
