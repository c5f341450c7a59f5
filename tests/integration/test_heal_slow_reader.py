"""A healer that reads a served checkpoint slowly must not hold up its source.

Real HTTP on 127.0.0.1. The slow reader is a real `HTTPTransport` receiver
whose chunk read stops after the response headers until the test releases it, so
the source's server is mid-stream (its state is larger than the socket
buffers) while the source disallows serving, commits and runs its optimizer
step. The source must not wait for that reader, and the reader, once released,
must get either the state of the step it asked for, value for value, or a
`RecoveryError`, never a mix of two steps.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchft_pg.checkpointing.http_fetch as http_fetch
from tests.unit.manager_fakes import make, result
from torchft_pg.checkpointing import HTTPTransport
from torchft_pg.errors import RecoveryError

#: The transport timeout: a source that waited for the slow reader would wait this long.
LONG = timedelta(seconds=120)
#: How long the test waits for the source's step; far below `LONG`.
PROMPT_S = 30.0


def big_state() -> dict[str, torch.Tensor]:
    # 64 MB: far more than loopback socket buffers hold, so the server is mid-stream
    # while the reader pauses; plus a small tensor (served from a combined copy).
    return {"w": torch.randn(16 << 20), "b": torch.randn(10)}


class SlowReads:
    """Makes every `ChunkFetcher` stop once a chunk's response headers are in, before
    the first piece of its body, until `release` is set: a stalled healer. The
    source's handler is then inside its transfer (it sent the headers while holding
    its reader slot) and blocks writing the body once the socket buffers are full."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        real = http_fetch.ChunkFetcher._read_exact

        def read_then_pause(
            fetcher: http_fetch.ChunkFetcher,
            sock: Any,
            resp: http.client.HTTPResponse,
            buf: memoryview,
        ) -> None:
            if not self.started.is_set():
                self.started.set()
                assert self.release.wait(PROMPT_S * 4), "the test never released the reader"
            real(fetcher, sock, resp, buf)

        monkeypatch.setattr(http_fetch.ChunkFetcher, "_read_exact", read_then_pause)

    @contextmanager
    def threads(self, n: int) -> Iterator[ThreadPoolExecutor]:
        """A pool for the reader and the source's step; on the way out the reader is
        released first, so a failed assertion never leaves the pool waiting on it."""
        with ThreadPoolExecutor(n) as pool:
            try:
                yield pool
            finally:
                self.release.set()


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> SlowReads:
    return SlowReads(monkeypatch)


@pytest.fixture
def source() -> Iterator[HTTPTransport[dict[str, Any]]]:
    t: HTTPTransport[dict[str, Any]] = HTTPTransport(LONG, bind_host="127.0.0.1")
    try:
        yield t
    finally:
        t.shutdown()


@pytest.fixture
def healer() -> Iterator[HTTPTransport[dict[str, Any]]]:
    t: HTTPTransport[dict[str, Any]] = HTTPTransport(LONG, bind_host="127.0.0.1")
    try:
        yield t
    finally:
        t.shutdown()


def test_disallow_returns_while_a_slow_reader_streams_and_it_gets_its_step(
    source: HTTPTransport[dict[str, Any]],
    healer: HTTPTransport[dict[str, Any]],
    slow: SlowReads,
) -> None:
    sd = big_state()
    at_step_3 = {k: v.clone() for k, v in sd.items()}
    source.send_checkpoint([1], 3, sd, LONG)
    with slow.threads(2) as pool:
        got = pool.submit(healer.recv_checkpoint, 0, source.metadata(), 3, LONG)
        assert slow.started.wait(PROMPT_S), "the reader never got a chunk's headers"
        assert source._gate.readers == 1, "the transfer is in flight on the source"
        disallowed = pool.submit(source.disallow_checkpoint)
        # The source's commit path: it must not wait for the reader (which only moves
        # once released below), so this completes while the reader is still parked.
        disallowed.result(timeout=PROMPT_S)
        assert not got.done() and not slow.release.is_set()
        for v in sd.values():  # the source's optimizer step, while the reader is parked
            v.add_(1.0)
        slow.release.set()
        out = got.result(timeout=PROMPT_S * 2)
    for k, v in at_step_3.items():
        assert torch.equal(out[k], v), f"{k}: not the state of step 3"
    assert source._gate.wait_idle(PROMPT_S)


def test_the_next_heal_window_cuts_a_reader_still_on_the_previous_step(
    source: HTTPTransport[dict[str, Any]],
    healer: HTTPTransport[dict[str, Any]],
    slow: SlowReads,
) -> None:
    """At most one stale snapshot lives on: a reader of step 3 still streaming when
    step 4 is served is cut off and fails its heal with a clear error."""
    sd = big_state()
    source.send_checkpoint([1], 3, sd, LONG)
    with slow.threads(1) as pool:
        got = pool.submit(healer.recv_checkpoint, 0, source.metadata(), 3, LONG)
        assert slow.started.wait(PROMPT_S)
        source.disallow_checkpoint()
        for v in sd.values():
            v.add_(1.0)
        source.send_checkpoint([1], 4, sd, LONG)  # the next step's heal window opens
        assert source._gate.wait_idle(PROMPT_S), "the stale stream was not cut off"
        slow.release.set()
        with pytest.raises(RecoveryError, match="step 3"):
            got.result(timeout=PROMPT_S * 2)
    assert source._gate.serving_step == 4


def test_a_source_managers_commit_does_not_wait_for_a_slow_healer(
    healer: HTTPTransport[dict[str, Any]], slow: SlowReads
) -> None:
    """The Manager's commit path (vote, disallow) with a real HTTP source transport."""
    source: HTTPTransport[dict[str, Any]] = HTTPTransport(LONG, bind_host="127.0.0.1")
    manager, client, _, _ = make([result(dst=[1], max_step=0)], transport=source)
    model = big_state()
    before = {k: v.clone() for k, v in model.items()}
    manager.register_state_dict_fn("model", lambda s: None, lambda: model)
    try:
        manager.start_quorum()
        manager.wait_quorum()
        assert manager.errored() is None
        # The source serves only the healers its quorum named: replica rank 1 of it.
        epoch, quorum_id = manager.quorum_id()
        healer.set_quorum(f"{epoch}/{quorum_id}", 1)
        with slow.threads(2) as pool:
            got = pool.submit(healer.recv_checkpoint, 0, source.metadata(), 0, LONG)
            # An asynchronous quorum serves at the vote (the healer waits for it).
            commit = pool.submit(manager.should_commit)
            assert commit.result(timeout=PROMPT_S) is True
            assert slow.started.wait(PROMPT_S)
            assert not got.done(), "the healer is still parked: the commit did not wait for it"
            for v in model.values():  # optimizer.step() after a successful commit
                v.add_(1.0)
            slow.release.set()
            out = got.result(timeout=PROMPT_S * 2)
        assert out["torchft"] == {"step": 0, "batches_committed": 0}
        for k, v in before.items():
            assert torch.equal(out["user"]["model"][k], v), f"{k}: not the state of step 0"
        assert manager.current_step() == 1 and client.votes == [(0, True)]
    finally:
        manager.shutdown()
