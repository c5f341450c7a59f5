"""Dump NCCL's flight recorder when a group is aborted (``TORCHFT_TRIGGER_FR_ON_ABORT``).

torchft's switch, with torchft's torch variables: with
``TORCHFT_TRIGGER_FR_ON_ABORT=true`` and c10d's debug pipe enabled
(``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<prefix>``), an abort first asks c10d to
dump the flight recorder by writing to ``<prefix><global rank>.pipe``, and
waits a bounded time (`DUMP_WAIT_S`) for the dump to appear at
``TORCH_FR_DUMP_TEMP_FILE<global rank>``, then aborts (torchft sleeps a fixed
60 s there). While enabled, each configuration's dumps go to a directory of
their own, ``<TORCH_FR_DUMP_TEMP_FILE>_quorum_<epoch>_<quorum id>/``, so the
dumps of two quorums never overwrite each other.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["DUMP_WAIT_S", "dump_path_for", "enabled", "trigger_dump"]

logger = logging.getLogger(__name__)

TRIGGER_ENV = "TORCHFT_TRIGGER_FR_ON_ABORT"
PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"
DUMP_WAIT_S = 10.0  # the longest an abort waits for the dump to appear (s)


def enabled(env: MutableMapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(TRIGGER_ENV, "").strip().lower() in ("1", "true", "yes")


def dump_path_for(base: str, quorum: str) -> str:
    """The dump prefix for the configuration at store prefix `quorum`
    (``torchft/<epoch>/<quorum id>/<group rank>``): a directory per quorum."""
    parts = [p for p in quorum.split("/") if p]
    tag = "_".join(parts[1:3]) if len(parts) >= 3 and parts[0] == "torchft" else "_".join(parts)
    return f"{base}_quorum_{tag}/"


def trigger_dump(
    global_rank: int, env: MutableMapping[str, str] | None = None, wait_s: float = DUMP_WAIT_S
) -> Path | None:
    """Ask c10d to dump the flight recorder of `global_rank`; return the dump's
    path once it exists (waiting at most `wait_s` seconds), else None. Never
    blocks on a pipe nobody reads."""
    env = os.environ if env is None else env
    prefix = env.get(PIPE_ENV)
    if not prefix:
        logger.warning(
            "%s is set but %s is not: c10d has no debug pipe, no flight recorder dump",
            TRIGGER_ENV,
            PIPE_ENV,
        )
        return None
    pipe = f"{prefix}{global_rank}.pipe"
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        why = "nobody reads it" if e.errno == errno.ENXIO else str(e)
        logger.warning("flight recorder dump not triggered through %s: %s", pipe, why)
        return None
    try:
        os.write(fd, b"1\n")
    finally:
        os.close(fd)
    dump = env.get(DUMP_ENV)
    if not dump:
        return None
    path = Path(f"{dump}{global_rank}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:  # bounded: the dump is written by c10d's thread
        if path.exists() and path.stat().st_size > 0:
            logger.warning("flight recorder dumped to %s", path)
            return path
        time.sleep(0.05)
    logger.warning("flight recorder dump did not appear at %s within %.1f s", path, wait_s)
    return None
