"""Quorum leases keep a loop that runs no collectives in step, as quorum rounds do,
and a replica that finishes first strands nobody (real lighthouse, real manager
servers, three Managers as threads of this process)."""

from __future__ import annotations

import threading
import time

import pytest

from lighthouse import LighthouseServer
from tests.managers import solo_manager
from tests.threads import run_in_threads

pytestmark = pytest.mark.timeout(120)
STEPS = 40


def test_leased_rounds_keep_replicas_in_step_and_the_first_to_finish_strands_nobody() -> None:
    called: dict[str, int] = {}  # replica -> the step whose start_quorum it last called
    violations: list[str] = []
    lock = threading.Lock()

    def replica(name: str, compute_s: float) -> int:
        with solo_manager(lh.address(), name) as manager:
            while manager.current_step() < STEPS:
                step = manager.current_step()
                with lock:
                    called[name] = step
                manager.start_quorum()  # asynchronous: should_commit waits for the round
                if compute_s:
                    time.sleep(compute_s)  # simulated compute: the slow replica
                manager.should_commit()
                with lock:
                    slowest = min(called.values())
                    if slowest < step - 1:  # the quorum is the step barrier
                        violations.append(f"{name} finished step {step} while one is at {slowest}")
            return int(lh.status()["quorums_issued"])

    with LighthouseServer(
        bind="127.0.0.1:0", min_replicas=3, join_timeout_ms=10_000, quorum_lease=True
    ) as lh:
        names = ["fast0", "fast1", "slow"]
        for n in names:
            called[n] = 0
        issued = run_in_threads(
            [lambda n=n: replica(n, 0.01 if n == "slow" else 0.0) for n in names],  # type: ignore[misc]
            timeout_s=100,
        )
    assert not violations, violations[:5]
    # the lease was used: far fewer lighthouse quorums than steps
    assert max(issued) < STEPS // 2, issued
