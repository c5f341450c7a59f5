"""IssueOrder: turns start in the order taken; a held turn makes later ones wait."""

from __future__ import annotations

import threading
from collections.abc import Callable

from torchft_pg.manager.issue_order import IssueOrder, Turn


def _noting(seen: list[str], name: str, releases: int = 1) -> Callable[[Turn], None]:
    """A start that notes `name` and releases its turn `releases` times."""

    def start(turn: Turn) -> None:
        seen.append(name)
        for _ in range(releases):
            turn.release()

    return start


def test_a_turn_starts_at_once_on_the_takers_thread_when_nothing_is_ahead() -> None:
    order = IssueOrder()
    seen: list[tuple[str, bool]] = []

    def start(turn: Turn) -> None:
        seen.append(("a", turn.inline))
        turn.release()

    turn = order.take(start)
    assert seen == [("a", True)] and turn.started and turn.released and order.idle()


def test_turns_taken_while_one_is_held_start_in_order_when_it_is_released() -> None:
    order = IssueOrder()
    seen: list[str] = []
    held: list[Turn] = []

    def hold(turn: Turn) -> None:
        seen.append("first stage")
        held.append(turn)  # released once its second stage is issued

    def plain(name: str) -> None:
        def start(turn: Turn) -> None:
            seen.append(name)
            turn.release()

        order.take(start)

    order.take(hold)
    plain("b")
    plain("c")
    assert seen == ["first stage"] and not order.idle()
    seen.append("second stage")
    held[0].release()
    assert seen == ["first stage", "second stage", "b", "c"] and order.idle()


def test_a_waiting_turn_starts_on_the_releasing_thread_not_inline() -> None:
    order = IssueOrder()
    held: list[Turn] = []
    started: list[tuple[str, bool]] = []
    order.take(held.append)

    def start(turn: Turn) -> None:
        started.append((threading.current_thread().name, turn.inline))
        turn.release()

    order.take(start)
    releaser = threading.Thread(target=held[0].release, name="completion")
    releaser.start()
    releaser.join(5.0)
    assert started == [("completion", False)]


def test_a_cancelled_turn_never_starts_and_lets_the_next_one_through() -> None:
    order = IssueOrder()
    held: list[Turn] = []
    seen: list[str] = []
    order.take(held.append)
    cancelled = order.take(_noting(seen, "cancelled"))
    order.take(_noting(seen, "next"))
    assert cancelled.cancel() is True
    assert cancelled.cancel() is True  # idempotent
    held[0].release()
    assert seen == ["next"]
    assert held[0].cancel() is False  # a started turn cannot be cancelled


def test_releasing_twice_or_a_start_that_raises_does_not_stall_the_order() -> None:
    order = IssueOrder()
    seen: list[str] = []

    def bad(turn: Turn) -> None:
        raise RuntimeError("unreported")

    order.take(bad)
    turn = order.take(_noting(seen, "after", releases=2))
    assert seen == ["after"] and turn.released and order.idle()


def test_a_turn_taken_from_inside_a_start_runs_after_it() -> None:
    order = IssueOrder()
    seen: list[str] = []

    def outer(turn: Turn) -> None:
        order.take(_noting(seen, "inner"))
        seen.append("outer")
        turn.release()

    order.take(outer)
    assert seen == ["outer", "inner"]


def test_a_claim_issues_without_a_turn_and_holds_off_turns_until_unclaimed() -> None:
    order = IssueOrder()
    seen: list[str] = []
    assert order.claim()
    assert not order.claim()  # one at a time
    order.take(_noting(seen, "taken meanwhile"))
    assert seen == []
    order.unclaim()
    assert seen == ["taken meanwhile"] and order.idle()
    held: list[Turn] = []
    order.take(held.append)
    assert not order.claim()  # a held turn: the op must take a turn of its own
    held[0].release()
    assert order.claim()
    order.unclaim()
