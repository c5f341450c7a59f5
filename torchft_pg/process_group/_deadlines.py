"""Each operation of a group bounded by our own deadline; at expiry, the caller aborts.

NCCL's own timeout is enforced by c10d's watchdog thread, which by default
tears the whole process down when an operation overstays: one hung peer in
another replica group would kill a healthy one. `ProcessGroupNCCL` instead
gives c10d a timeout long enough never to fire first and bounds every
operation here: when an operation has not completed (on the device, as its
future reports) within the group's timeout, the group aborts its communicator
(``ncclCommAbort``), every in-flight operation fails, the step votes no and
the next quorum rebuilds the group, and the process lives on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from torch.distributed import Work

from torchft_pg.futures import watchdog

__all__ = ["bound_by_deadline"]


def bound_by_deadline(work: Work, timeout: timedelta, expire: Callable[[], None]) -> Work:
    """Call `expire` (once, on the watchdog's thread) if `work` has not completed
    within `timeout`; returns `work`. A work without a future is returned as is:
    its caller's ``wait`` is what bounds it."""
    try:
        future = work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented"
        return work
    handle = watchdog.schedule(timeout, expire)
    future.add_done_callback(lambda _: watchdog.cancel(handle))
    return work
