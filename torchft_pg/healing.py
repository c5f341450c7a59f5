"""What a replica serves to, and loads from, a peer when one of them heals.

The payload is ``{"user": {key: save()}, "torchft": {"step", "batches_committed"}}``:
every registered user state (model, optimizer, …) plus the Manager's own
counters, so a healed replica resumes at exactly the sender's committed step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torchft_pg.errors import RecoveryError

__all__ = ["ReadGate", "StateDictRegistry"]


class ReadGate:
    """Lets heal sends read the user's state only while the user allows it.

    `disallow()` waits for a read in progress to finish and then blocks new
    ones until `allow()`; a reader waits at most its `timeout_s` seconds and
    then fails the heal (the step votes no) instead of stalling the job. Not
    tied to a thread: the training thread disallows, the quorum thread reads.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._allowed = True

    @property
    def allowed(self) -> bool:
        return self._allowed

    def allow(self) -> None:
        with self._cond:
            self._allowed = True
            self._cond.notify_all()

    def disallow(self) -> None:
        with self._cond:
            self._allowed = False
            self._cond.wait_for(lambda: self._readers == 0)

    @contextlib.contextmanager
    def reading(self, timeout_s: float) -> Iterator[None]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._allowed, timeout_s):
                raise RecoveryError(
                    f"state dict reads stayed disallowed for {timeout_s:.3f} s "
                    "(disallow_state_dict_read() without allow_state_dict_read())"
                )
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()


class StateDictRegistry:
    """Named (load, save) pairs for user state, and the heal payload built from them."""

    def __init__(self) -> None:
        self._fns: dict[str, tuple[Callable[[Any], None], Callable[[], Any]]] = {}
        self._lock = threading.Lock()

    def register(self, key: str, load: Callable[[Any], None], save: Callable[[], Any]) -> None:
        if not key or not isinstance(key, str):
            raise ValueError(f"state dict key must be a non-empty str, got {key!r}")
        if not callable(load) or not callable(save):
            raise TypeError(f"load and save for {key!r} must be callables")
        with self._lock:
            if key in self._fns:
                raise ValueError(f"a state dict function is already registered under {key!r}")
            self._fns[key] = (load, save)

    def keys(self) -> list[str]:
        return list(self._fns)

    def payload(self, manager_state: dict[str, int]) -> dict[str, Any]:
        """The state a healing peer receives (live references: served until disallowed)."""
        return {
            "user": {key: save() for key, (_, save) in self._fns.items()},
            "torchft": dict(manager_state),
        }

    def apply(self, user_state: dict[str, Any]) -> None:
        """Load a received payload's user part through each registered load function."""
        missing = set(self._fns) - set(user_state)
        if missing:
            raise KeyError(
                f"healing payload lacks registered state {sorted(missing)}; has {sorted(user_state)}"
            )
        for key, (load, _) in self._fns.items():
            load(user_state[key])
