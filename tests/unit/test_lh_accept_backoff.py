"""AcceptBackoff: an accept loop out of descriptors waits, doubling, and says so once."""

from __future__ import annotations

import errno
import os

import pytest

from lighthouse.accept_backoff import OUT_OF_DESCRIPTORS, AcceptBackoff
from lighthouse.clock import FakeClock

EMFILE = OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def test_waits_double_up_to_the_longest_and_only_the_first_failure_is_logged() -> None:
    clock = FakeClock()
    b = AcceptBackoff("status server", first_s=0.05, max_s=1.0)
    delays, lines = [], []
    for _ in range(7):
        delay, line = b.failed(EMFILE, clock.now())
        delays.append(delay)
        lines.append(line)
        clock.advance(delay)
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert lines[0] is not None and "Too many open files" in lines[0], lines[0]
    assert "instead of spinning" in lines[0] and lines[1:] == [None] * 6
    assert b.failing and b.episodes == 1
    recovered = b.accepted(clock.now())
    assert (
        recovered
        == "status server: accepting connections again after 7 failed accept(s) over 3.5 s"
    )
    assert b.accepted(clock.now()) is None and not b.failing  # once per episode
    assert b.failed(EMFILE, clock.now()) == (0.05, lines[0])  # a new episode
    assert b.episodes == 2


def test_only_resource_errors_are_waited_out_and_bad_waits_are_refused() -> None:
    assert errno.EMFILE in OUT_OF_DESCRIPTORS and errno.ENFILE in OUT_OF_DESCRIPTORS
    assert errno.ECONNABORTED not in OUT_OF_DESCRIPTORS
    with pytest.raises(ValueError, match=r"first_s=2\.0, max_s=1\.0"):
        AcceptBackoff("x", first_s=2.0, max_s=1.0)
    with pytest.raises(ValueError, match="first_s=0"):
        AcceptBackoff("x", first_s=0)
