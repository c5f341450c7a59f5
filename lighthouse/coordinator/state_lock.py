"""One lighthouse per job state file: an exclusive lock beside it.

Two lighthouses serving one job would hand out quorums independently, and
both would write the job's committed step. So a lighthouse with a state file
holds an exclusive ``flock`` on ``<state file>.lock`` for as long as it runs
(the kernel releases it when the process ends, also on SIGKILL), and writes
its pid and start time into it so that the one refused can say who holds it.

A second lighthouse on the same file is refused at once, naming the holder;
a *standby* (``--standby``) instead waits for the lock and starts serving
only once it holds it: when the active lighthouse has exited or died. The
standby then reads the job state the active one last wrote, so the job's
committed step survives the takeover.

``flock`` is exclusive between processes of one host, and on network file
systems that implement it (NFS v4 with its lock manager, CephFS, Lustre with
``flock`` mounts). Where it is not enforced, do not run a standby against a
shared file.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

__all__ = ["StateFileLock", "StateFileLockedError"]

POLL_S = 0.1  # how often a standby tries the lock (s): a takeover is found this soon


class StateFileLockedError(OSError):
    """Another lighthouse holds the lock of this job state file."""


class StateFileLock:
    """The exclusive lock of the job state file at ``state_path`` (on
    ``<state_path>.lock``). Not reentrant; one per lighthouse."""

    def __init__(self, state_path: str | os.PathLike[str]) -> None:
        self.path = Path(f"{os.fspath(state_path)}.lock")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it ("" if unknown)."""
        try:
            return self.path.read_text(encoding="utf-8").strip()
        except OSError:
            return ""

    def _try(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        self._fd = fd
        return True

    def acquire(self) -> None:
        """Take the lock now; `StateFileLockedError` naming the holder if another
        lighthouse has it."""
        if self._fd is not None:
            return
        if not self._try():
            holder = self.holder()
            raise StateFileLockedError(
                f"another lighthouse ({holder or 'holder unknown'}) serves the job state file "
                f"{str(self.path)[: -len('.lock')]}: one lighthouse per job. Stop it, give this "
                "one its own --state-file, or start this one with --standby to take over when "
                "that one exits"
            )

    def wait(self, stop: threading.Event) -> bool:
        """Wait until the lock is ours (a standby), trying every `POLL_S` seconds
        (the other process's exit has no event to wait on); False if `stop` is
        set first."""
        while not self._try():
            if stop.wait(POLL_S):
                return False
        return True

    def release(self) -> None:
        """Let the next lighthouse (a standby) take the job over."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock
