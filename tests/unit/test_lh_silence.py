"""The silence rule: a replica silent to the lighthouse long enough during a step votes no."""

from __future__ import annotations

import pytest

from lighthouse.replica.silence import Silences, silent_too_long


def test_no_pings_yet_is_no_silence() -> None:
    assert Silences().longest_since(0.0, 100.0) == 0.0


def test_regular_pings_leave_only_short_gaps() -> None:
    s = Silences()
    for i in range(50):
        s.ran(i * 0.1)
    assert s.longest_since(1.0, 4.95) < 0.25  # regular pings: only the one still going


def test_a_freeze_inside_the_window_counts_whole_and_one_before_it_is_clipped() -> None:
    s = Silences()
    s.ran(0.0)
    s.ran(0.1)
    s.ran(4.1)  # frozen from 0.1 to 4.1
    s.ran(4.2)
    assert s.longest_since(0.0, 4.3) == pytest.approx(4.0)
    assert s.longest_since(3.0, 4.3) == pytest.approx(1.1)  # only its part after the start
    assert s.longest_since(4.15, 4.3) == pytest.approx(0.1)


def test_the_silence_still_going_counts() -> None:
    # Frozen, then woken: the commit is handled before the pinger ran again.
    s = Silences()
    s.ran(1.0)
    assert s.longest_since(0.5, 5.0) == pytest.approx(4.0)


def test_ninety_percent_of_the_lighthouse_timeout_is_too_long_and_an_unknown_timeout_never_is() -> (
    None
):
    assert silent_too_long(1.8, 2.0)
    assert not silent_too_long(1.79, 2.0)
    assert not silent_too_long(100.0, None)
