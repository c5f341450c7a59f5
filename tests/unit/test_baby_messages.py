"""The Baby PG's messages and their framing, over a real SOCK_SEQPACKET socketpair."""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from torchft_pg.process_group.baby import messages as msgs
from torchft_pg.store import StoreAddress


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, msgs.Receiver]]:
    a, b = msgs.socket_pair()
    try:
        yield a, msgs.Receiver(b)
    finally:
        a.close()
        b.close()


def test_control_messages_round_trip(pair: tuple[socket.socket, msgs.Receiver]) -> None:
    sock, receiver = pair
    sent: list[msgs.Message] = [
        msgs.Ready(request_id=0, pid=123),
        msgs.Configure(
            request_id=4,
            address=StoreAddress(host="::1", port=29500, prefix="torchft/1/2"),
            rank=1,
            world_size=3,
            timeout_s=2.5,
        ),
        msgs.Configured(request_id=4, error="RuntimeError: no", timed_out=True),
        msgs.Shutdown(),
    ]
    for message in sent:
        msgs.send(sock, message)
        got, payload, fds = receiver.recv()
        assert got == message and len(payload) == 0 and fds == []


def test_op_messages_carry_raw_bytes_after_the_header(
    pair: tuple[socket.socket, msgs.Receiver],
) -> None:
    sock, receiver = pair
    data = np.arange(5, dtype=np.float32)
    op = msgs.RunOp(op_id=7, name="allreduce", args=[[("i", "float32", (5,))]], forget=[])
    msgs.send(sock, op, [data, b"xy"])
    got, payload, _ = receiver.recv()
    assert isinstance(got, msgs.RunOp)
    assert (got.op_id, got.name, got.args, got.forget) == (7, "allreduce", op.args, [])
    assert payload.tobytes() == data.tobytes() + b"xy"
    msgs.send(sock, msgs.OpDone(op_id=7, error=None, source_rank=1))
    done, _, _ = receiver.recv()
    assert isinstance(done, msgs.OpDone)
    assert (done.op_id, done.error, done.source_rank) == (7, None, 1)


def test_file_descriptors_ride_along(pair: tuple[socket.socket, msgs.Receiver]) -> None:
    sock, receiver = pair
    r, w = os.pipe()
    try:
        msgs.send(sock, msgs.Shutdown(), fds=[r])
        _, _, fds = receiver.recv()
        assert len(fds) == 1 and fds[0] != r
        os.write(w, b"!")
        assert os.read(fds[0], 1) == b"!"  # the same pipe, a new descriptor
        os.close(fds[0])
    finally:
        os.close(r)
        os.close(w)


def test_eof_and_an_unknown_tag_are_errors(pair: tuple[socket.socket, msgs.Receiver]) -> None:
    sock, receiver = pair
    header = pickle.dumps((99, "x"))
    sock.sendmsg([struct.pack("<I", len(header)), header])
    with pytest.raises(ValueError, match="unknown Baby PG message tag 99"):
        receiver.recv()
    sock.close()
    with pytest.raises(EOFError):
        receiver.recv()


def test_sending_something_else_is_a_type_error(pair: tuple[socket.socket, msgs.Receiver]) -> None:
    sock, _ = pair
    with pytest.raises(TypeError, match="not a Baby PG message"):
        msgs.send(sock, ("op", 1))  # type: ignore[arg-type]


def test_control_messages_are_frozen_and_keyword_only() -> None:
    ready = msgs.Ready(request_id=0, pid=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ready.pid = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        msgs.Ready(0, 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        msgs.RunOp(1, "allreduce", [], [])  # type: ignore[misc]
