"""The job's committed step on disk, so a restarted lighthouse still refuses a reset.

The lighthouse keeps the highest step any replica reported (quorum rule 6). In
memory alone it would be lost with the lighthouse; a lighthouse restarted
while every up-to-date replica is also gone would then let a fresh replica
restart the job from step 0. ``JobStateFile`` records it in a small JSON file
(``{"committed_step": N, "quorum_members": M, "epoch": ...,
"updated_unix_ms": ...}``; ``quorum_members``, the size of the latest quorum,
lets a restarted lighthouse wait for that many replicas before it trusts a
small quorum, see rule 3 in ``quorum.py``), replaced
atomically (write a temporary file, then rename) so a crash mid-write leaves
the old record, never a torn one.

Writes are throttled: at most one every ``min_interval_s`` seconds (the
lighthouse flushes the latest value on its next tick and at shutdown), so a
job committing hundreds of steps a second costs a few small writes a second.
After a SIGKILL the file trails the true committed step by at most that
interval's worth of steps.

A write that fails (a full disk, a removed directory, no file descriptor
left) is reported as what it is and raises nothing: the lighthouse keeps the
step in memory, its quorums go on (none needs the file once it is loaded),
and the next write retries. The failure is logged once when writes start
failing and once when they work again, and ``error`` says it meanwhile
(``/status`` shows it as ``job_state_error``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["JobStateFile"]

DEFAULT_MIN_INTERVAL_S = 0.1

log = logging.getLogger("lighthouse")


class JobStateFile:
    """Reads and writes the committed step at ``path``. Not thread-safe: the
    lighthouse calls it from its event loop only."""

    def __init__(
        self, path: str | os.PathLike[str], min_interval_s: float = DEFAULT_MIN_INTERVAL_S
    ):
        self.path = Path(path)
        self.min_interval_s = min_interval_s
        self._saved: tuple[int, int] | None = None  # (committed step, quorum members)
        self._wanted: tuple[int, int] | None = None
        self.quorum_members = 0  # as loaded
        self._last_write = float("-inf")
        self.epoch = ""
        # the failing episode, if writes fail now: the first error, when, and how many
        self._failure: tuple[str, int, int] | None = None  # (error, since unix ms, failures)

    def load(self) -> int:
        """The recorded committed step; 0 if the file does not exist yet.

        Raises ``ValueError`` naming the file if it exists but is not a record
        this class wrote: silently treating it as step 0 would defeat its purpose.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._saved = (0, 0)
            return 0
        try:
            record = json.loads(text)
            step = record["committed_step"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"lighthouse state file {str(self.path)!r} is not a job-state record "
                f'(expected JSON {{"committed_step": <int>, ...}}): {exc}'
            ) from None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(
                f"lighthouse state file {str(self.path)!r}: committed_step must be an int >= 0, "
                f"got {step!r}"
            )
        members = record.get("quorum_members", 0)  # absent in older records
        if isinstance(members, bool) or not isinstance(members, int) or members < 0:
            members = 0
        self.quorum_members = members
        self._saved = (step, members)
        return step

    def record(
        self, committed_step: int, now: float | None = None, quorum_members: int = 0
    ) -> bool:
        """Note the current committed step and quorum size; write them if the
        throttle allows. True if written now. ``now``: monotonic seconds (tests pass it)."""
        self._wanted = (committed_step, quorum_members)
        return self.flush(now, force=False)

    def flush(self, now: float | None = None, force: bool = True) -> bool:
        """Write the latest recorded step if it differs from the file's (``force``
        ignores the throttle). True if written; False if nothing was due or the
        write failed (see ``error``; a later call retries)."""
        wanted = self._wanted
        if wanted is None or wanted == self._saved:
            return False
        now = time.monotonic() if now is None else now
        if not force and now - self._last_write < self.min_interval_s:
            return False
        self._last_write = now  # a failed write is retried after the interval too
        try:
            self._write(wanted)
        except OSError as exc:
            self._failed(exc, wanted[0])
            return False
        self._saved = wanted
        if self._failure is not None:
            error, since_ms, failures = self._failure
            self._failure = None
            log.info(
                "job state file %r written again (committed step %d) after %d failed write(s) "
                "over %.1f s (first: %s)",
                str(self.path),
                wanted[0],
                failures,
                (time.time() * 1000 - since_ms) / 1000,
                error,
            )
        return True

    def _failed(self, exc: OSError, step: int) -> None:
        """Count a failed write; log the first of an episode."""
        if self._failure is not None:
            error, since_ms, failures = self._failure
            self._failure = (error, since_ms, failures + 1)
            return
        error = f"{type(exc).__name__}: {exc}"
        self._failure = (error, int(time.time() * 1000), 1)
        log.error(
            "cannot write the job state file %r: %s. The committed step (%d) is kept in "
            "memory and quorums go on; a lighthouse restarted before a write succeeds would "
            "remember an older step. Retrying; logged again once it works",
            str(self.path),
            error,
            step,
        )

    @property
    def error(self) -> dict[str, Any] | None:
        """None while writes work; else ``{"error", "since_unix_ms", "failed_writes"}``
        of the failures since the last write that worked."""
        if self._failure is None:
            return None
        error, since_ms, failures = self._failure
        return {"error": error, "since_unix_ms": since_ms, "failed_writes": failures}

    def _write(self, wanted: tuple[int, int]) -> None:
        step, members = wanted
        record = {
            "committed_step": step,
            "quorum_members": members,
            "epoch": self.epoch,
            "updated_unix_ms": int(time.time() * 1000),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
                f.write("\n")
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a half-written temporary (a full disk) is not left behind
            raise
