"""What a rank needs of its replica group's manager server, as Protocols.

``ManagerClient`` (gRPC, every rank) and ``LocalManagerClient`` (in-process,
group rank 0) implement them fully, and so do the Manager's unit-test fakes;
the Manager calls these methods and nothing else.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from lighthouse.types import FailureNotice, ManagerQuorumRequest, QuorumResult

__all__ = ["FailureSubscriptionProtocol", "ManagerClientProtocol"]


class FailureSubscriptionProtocol(Protocol):
    """The handle ``subscribe_failures`` returns."""

    def wait_ready(self, timeout: timedelta) -> bool:
        """Wait until notices are delivered; False if ``timeout`` passed first."""
        ...

    def cancel(self) -> None:
        """Stop delivering notices (bounded: a few seconds at most)."""
        ...


class ManagerClientProtocol(Protocol):
    """A client of one replica group's manager server. Every timeout is a
    positive ``timedelta``; failures raise ``lighthouse.errors`` types."""

    def quorum(self, request: ManagerQuorumRequest) -> QuorumResult:
        """Join this step's quorum; returns once every rank of the group asked and
        the lighthouse answered (within ``request.timeout``), or raises."""
        ...

    def quorum_async(
        self, request: ManagerQuorumRequest
    ) -> concurrent.futures.Future[QuorumResult]:
        """``quorum`` without blocking: the future gets the result or the error.
        Where it completes is the client's choice (the in-process server's loop,
        or a worker thread of a remote client), so callbacks must not block."""
        ...

    def checkpoint_metadata(self, rank: int, timeout: timedelta) -> str:
        """The checkpoint metadata group rank ``rank`` sent with its last quorum."""
        ...

    def should_commit(
        self, group_rank: int, step: int, should_commit: bool, timeout: timedelta
    ) -> bool:
        """Vote for ``step``; True only if every rank of the group voted yes."""
        ...

    def subscribe_failures(
        self,
        callback: Callable[[FailureNotice], None],
        group_rank: int = 0,
        on_error: Callable[[Exception], None] | None = None,
    ) -> FailureSubscriptionProtocol:
        """Call ``callback(notice)`` on a background thread for every failure notice
        about this group's quorum; ``on_error`` if the subscription breaks."""
        ...

    def close(self) -> None:
        """Release the client's channels and threads; later calls fail."""
        ...
