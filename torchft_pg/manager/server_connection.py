"""One rank's live connection to its replica group's manager server.

`group_server.connect_replica_group` finds the server (rank 0 starts it);
`ServerConnection` runs that in the background, holds the client it returns,
subscribes to the lighthouse's failure notices through it and closes it all
at shutdown. A connection given a ready client (unit tests' fakes) only
subscribes.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from lighthouse import (
    FailureSubscriptionProtocol,
    ManagerClientProtocol,
    ManagerServer,
)
from torchft_pg.manager.config import ManagerConfig
from torchft_pg.manager.group_server import connect_replica_group
from torchft_pg.manager.notices import NoticeRouter
from torchft_pg.manager.step_state import StepState
from torchft_pg.process_group.base import ProcessGroup

__all__ = ["ServerConnection"]

logger = logging.getLogger(__name__)


class ServerConnection:
    """The client of this group's manager server, once connected.

    Connecting gives the group's name, `state.replica_id`, its incarnation
    suffix. Each failure notice goes to `notices` (on the notice stream's
    thread).
    """

    def __init__(self, *, state: StepState, pg: ProcessGroup, notices: NoticeRouter) -> None:
        self._state = state
        self._pg = pg
        self._notices = notices
        self._server: ManagerServer | None = None  # rank 0's, once started
        self._client: ManagerClientProtocol | None = None  # set once connected
        self._subscription: FailureSubscriptionProtocol | None = None
        self._connected: ThreadFuture[None] | None = None  # None: given a ready client

    def start(
        self,
        executor: ThreadPoolExecutor,
        config: ManagerConfig,
        heartbeat_interval: timedelta | None,
        connect_timeout: timedelta,
        retries: int,
    ) -> None:
        """Connect on `executor` (the quorum thread), overlapping whatever the caller
        does before its first `client()`; that call raises connecting's error."""
        self._connected = executor.submit(
            self._connect, config, heartbeat_interval, connect_timeout, retries
        )

    def _connect(
        self,
        config: ManagerConfig,
        heartbeat_interval: timedelta | None,
        connect_timeout: timedelta,
        retries: int,
    ) -> None:
        # Not visible to the lighthouse before the group can meet its peers: a
        # replica that asks for a quorum (or is merely live) while its group still
        # starts (a Baby child importing torch) stalls every peer's next step.
        try:
            self._pg.wait_started(connect_timeout)
        except Exception as e:  # the first configure starts afresh and reports its own error
            logger.warning(
                "replica %s: process group start-up failed: %s", self._state.replica_id, e
            )
        client, self._state.replica_id, self._server = connect_replica_group(
            config, config.hostname, heartbeat_interval, connect_timeout, retries
        )
        self.use(client)

    def use(self, client: ManagerClientProtocol) -> None:
        """Talk through `client` and subscribe to failure notices through it."""
        self._client = client
        self._subscription = client.subscribe_failures(
            self._notices.on_notice,
            group_rank=self._state.group_rank,
            on_error=self._on_watch_error,
        )

    def _on_watch_error(self, e: Exception) -> None:
        logger.warning("%s failure-notice stream broke: %s", self._state.tag(), e)

    def lighthouse_wait(self) -> str | None:
        """Why the lighthouse holds this group's quorum request, as it last told the
        group's server (only group rank 0 hosts it; None elsewhere, or if it said
        nothing since the request went out)."""
        server = self._server
        wait = server.lighthouse_wait() if server is not None else None
        return None if wait is None else wait.reason

    def client(self) -> ManagerClientProtocol:
        """Raise the start-up connection's error, or return the client once it is done."""
        if self._connected is not None:
            self._connected.result()
        assert self._client is not None  # set by use() before _connected completes
        return self._client

    def stop_notices(self) -> None:
        """Shutdown, first part: let connecting end (a server still starting would
        outlive us) and stop the notice subscription."""
        if self._connected is not None:
            with contextlib.suppress(Exception):  # one that never came up needs no stop
                self._connected.result()
        if self._subscription is not None:
            self._subscription.cancel()

    def close(self) -> None:
        """Shutdown, last part: stop rank 0's server and close the client."""
        if self._server is not None:
            self._server.shutdown()
        if self._client is not None:  # None if connecting failed
            self._client.close()
