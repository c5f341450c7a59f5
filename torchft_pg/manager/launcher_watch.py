"""Leave the job when the launcher that started this process dies.

torchrun (torch 2.13) starts each worker in a session of its own, so killing
torchrun, even with SIGKILL, leaves its workers training on as that replica
group: its peers keep counting it, and a restarted group is refused while the
orphans hold its place. A Manager started under a launcher therefore watches
its parent process: once the parent is gone (this process was re-parented),
it logs why and terminates itself (SIGTERM, then an exit 2 s later if that did
not end it), so the group's liveness stream to the lighthouse closes and its
peers go on without it within about a second.

Watched: a process torchrun started (``TORCHELASTIC_RUN_ID`` is set), or any
process with ``TORCHFT_EXIT_WITH_LAUNCHER=1``; ``TORCHFT_EXIT_WITH_LAUNCHER=0``
turns it off. The check is one ``getppid()`` every `POLL_S` seconds on a
daemon thread.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping

__all__ = ["POLL_S", "should_watch", "watch_launcher"]

logger = logging.getLogger(__name__)

POLL_S = 0.5  # between two looks at the parent (s)
GRACE_S = 2.0  # after SIGTERM, before exiting anyway (s)
SWITCH_ENV = "TORCHFT_EXIT_WITH_LAUNCHER"

_lock = threading.Lock()
_watching = False


def should_watch(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process should leave with its launcher (see the module docstring)."""
    env = os.environ if env is None else env
    switch = env.get(SWITCH_ENV, "").strip().lower()
    if switch in ("0", "false", "no"):
        return False
    return switch in ("1", "true", "yes") or "TORCHELASTIC_RUN_ID" in env


def watch_launcher(
    on_orphaned: Callable[[int], None] | None = None, poll_s: float = POLL_S
) -> bool:
    """Start watching this process's parent, once per process (later calls return
    False). `on_orphaned(launcher_pid)` runs when it is gone; by default this
    process logs and terminates itself."""
    global _watching
    with _lock:
        if _watching:
            return False
        _watching = True
    launcher = os.getppid()
    act = on_orphaned or _leave
    thread = threading.Thread(
        target=_watch, args=(launcher, act, poll_s), name="torchft_pg-launcher-watch", daemon=True
    )
    thread.start()
    return True


def _watch(launcher: int, act: Callable[[int], None], poll_s: float) -> None:
    stop = threading.Event()  # never set: the thread lives as long as the process
    while os.getppid() == launcher:
        stop.wait(poll_s)
    act(launcher)


def _leave(launcher: int) -> None:
    logger.critical(
        "the launcher that started this process (pid %d) is gone: leaving the job so this "
        "replica group's peers go on without it (%s=0 keeps the process running)",
        launcher,
        SWITCH_ENV,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(GRACE_S)
    os._exit(1)
