"""What benchmarks read of other processes: their CPU time, from /proc."""

from __future__ import annotations

import os

__all__ = ["process_cpu_s"]


def process_cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has used, all its live threads (the nanosecond
    counters of /proc/PID/task/*/schedstat: a clock tick, 10 ms, is too coarse
    for one round or one batch of calls)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total / 1e9
