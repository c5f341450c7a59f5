"""The job's committed step on disk, so a restarted lighthouse still refuses a reset.

The lighthouse keeps the job's committed step (quorum rule 6): what the members
of a quorum reached together, never a step one request claims
(``lighthouse.coordinator.committed``), so the file only ever holds committed
facts, and a file that holds anything else is refused at start (``load``). In
memory alone it would be lost with the lighthouse; a lighthouse restarted
while every up-to-date replica is also gone would then let a fresh replica
restart the job from step 0. ``JobStateFile`` records it in a small JSON file
(``{"committed_step": N, "quorum_members": M, "run_ended": false, "epoch": ...,
"updated_unix_ms": ...}``; ``run_ended``: the run that committed step N ended
cleanly, so a new run from step 0 is admitted; ``quorum_members``, how many members last reached a step together,
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

__all__ = ["MAX_RECORDED_MEMBERS", "MAX_RECORDED_STEP", "JobStateFile"]

DEFAULT_MIN_INTERVAL_S = 0.1
#: The highest committed step a state file may record: 2**53, where JSON readers
#: (the dashboard's JavaScript among them) stop counting exactly; a million steps a
#: second would take 285 years to get there. A larger number is absurd, not a job.
MAX_RECORDED_STEP = 2**53
#: The largest quorum a state file may record (a lighthouse tracks 4096 replica ids
#: by default; ``max_tracked_replicas`` may raise that, not to a million).
MAX_RECORDED_MEMBERS = 2**20

log = logging.getLogger("lighthouse")


class JobStateFile:
    """Reads and writes the committed step at ``path``. Not thread-safe: the
    lighthouse calls it from its event loop only."""

    def __init__(
        self, path: str | os.PathLike[str], min_interval_s: float = DEFAULT_MIN_INTERVAL_S
    ):
        self.path = Path(path)
        self.min_interval_s = min_interval_s
        # (committed step, quorum members, run ended)
        self._saved: tuple[int, int, bool] | None = None
        self._wanted: tuple[int, int, bool] | None = None
        self.quorum_members = 0  # as loaded
        self.run_ended = False  # as loaded
        self._last_write = float("-inf")
        self.epoch = ""
        # the failing episode, if writes fail now: the first error, when, and how many
        self._failure: tuple[str, int, int] | None = None  # (error, since unix ms, failures)

    def load(self) -> int:
        """The recorded committed step; 0 if the file does not exist yet.

        Raises ``ValueError`` naming the file, the field, its value and what was
        expected if the file exists but is not a record this class could have
        written: corrupt (not JSON, not an object, no ``committed_step``) or
        absurd (a step above ``MAX_RECORDED_STEP``, a quorum size above
        ``MAX_RECORDED_MEMBERS``, a negative or non-integer number). Obeying
        such a file would refuse every quorum below a step nobody holds, and
        treating it as step 0 would defeat its purpose: the operator decides.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._saved = (0, 0, False)
            return 0
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise self._refused(f"it is not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise self._refused(f"expected a JSON object, got {type(record).__name__}")
        if "committed_step" not in record:
            raise self._refused(
                f'it is not a job-state record (expected JSON {{"committed_step": <int>, ...}}, '
                f"got the keys {sorted(record)[:8]})"
            )
        step = _counter(self, record, "committed_step", MAX_RECORDED_STEP)
        members = _counter(self, record, "quorum_members", MAX_RECORDED_MEMBERS)
        epoch = record.get("epoch", "")
        if not isinstance(epoch, str) or len(epoch) > 64:
            raise self._refused(
                f"epoch must be a string of at most 64 characters, got {epoch!r:.80}"
            )
        ended = record.get("run_ended", False)
        if not isinstance(ended, bool):
            raise self._refused(f"run_ended must be true or false, got {ended!r:.80}")
        self.quorum_members = members
        self.run_ended = ended
        self._saved = (step, members, ended)
        return step

    def _refused(self, why: str) -> ValueError:
        return ValueError(
            f"lighthouse state file {str(self.path)!r} is refused: {why}. It is not obeyed: "
            "fix it, move it away (the committed step is then learnt again from what the "
            "replicas reach together), or choose another with --state-file"
        )

    def record(
        self,
        committed_step: int,
        now: float | None = None,
        quorum_members: int = 0,
        run_ended: bool = False,
    ) -> bool:
        """Note the current committed step, quorum size and whether the run ended;
        write them if the throttle allows. True if written now. ``now``: monotonic
        seconds (tests pass it)."""
        self._wanted = (committed_step, quorum_members, run_ended)
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

    def _write(self, wanted: tuple[int, int, bool]) -> None:
        step, members, ended = wanted
        record = {
            "committed_step": step,
            "quorum_members": members,
            "run_ended": ended,
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


def _counter(f: JobStateFile, record: dict[str, Any], key: str, maximum: int) -> int:
    """``record[key]``, an int in [0, ``maximum``] (0 if absent: older records
    have no ``quorum_members``), else ``f``'s refusal naming it."""
    value = record.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise f._refused(f"{key} must be an int in [0, {maximum}], got {value!r:.80}")
    return value
