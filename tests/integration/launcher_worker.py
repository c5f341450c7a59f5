"""A replica group's rank that steps until killed (for test_launcher_exit).

Run under torchrun or alone, with torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), TORCHFT_LIGHTHOUSE and REPLICA_GROUP_ID. Prints one
JSON line when ready (with its pid) and one per step.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta

import torch

from torchft_pg import ProcessGroupGloo
from torchft_pg.manager import Manager

MAX_STEPS = 100_000  # the test kills the process long before
PACE_S = 0.02  # stands for a step's compute (s)
# CRASH_AT_STEP=N: group rank 1 of torchrun's first incarnation exits 1 once its group
# has committed N steps (or healed past them) and at least one of them with another
# group, so a live peer holds the job's committed step when it comes back (a group that
# trained alone and died takes the committed step with it, and the lighthouse rightly
# refuses to restart the job below it).
CRASH_AT = int(os.environ.get("CRASH_AT_STEP", "-1"))


def emit(fields: dict[str, object]) -> None:
    """One line in one write: torchrun's ranks share this pipe."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> int:
    timeout = timedelta(seconds=10)
    manager = Manager(
        ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=30),
    )
    emit(
        {
            "event": "ready",
            "pid": os.getpid(),
            "rank": os.environ["RANK"],
            "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
        }
    )
    pace = threading.Event()
    first_incarnation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    shared = False  # committed a step with another group
    for _ in range(MAX_STEPS):
        if (
            first_incarnation
            and os.environ["RANK"] == "1"
            and shared
            and manager.current_step() >= CRASH_AT >= 0
        ):
            emit({"event": "crash", "pid": os.getpid()})
            os._exit(1)
        manager.start_quorum()
        t = torch.ones(1)
        manager.allreduce(t).wait()
        committed = manager.should_commit()
        shared = shared or (committed and manager.num_participants() > 1)
        emit(
            {
                "event": "step",
                "replica": os.environ["REPLICA_GROUP_ID"],
                "rank": os.environ["RANK"],
                "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
                "step": manager.current_step(),
                "committed": committed,
                "participants": manager.num_participants(),
            }
        )
        pace.wait(PACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
