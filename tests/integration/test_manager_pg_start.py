"""A replica group is not live at the lighthouse before its process group has started:
a group still starting (a Baby child importing torch) would stall its peers' quorums
(real lighthouse, real manager server, the Manager in this process)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from torchft_pg import ProcessGroupDummy
from torchft_pg.manager import Manager

pytestmark = pytest.mark.timeout(60)
T = timedelta(seconds=10)


class _SlowToStart(ProcessGroupDummy):
    """A group whose start-up lasts until the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()  # the Manager is waiting for our start-up
        self.started = threading.Event()

    def wait_started(self, timeout: timedelta) -> None:
        self.waiting.set()
        assert self.started.wait(timeout.total_seconds())


def _live(lh: LighthouseServer) -> list[str]:
    return [r["replica_id"] for r in lh.status()["live"]]


def test_the_manager_connects_only_once_its_process_group_started() -> None:
    with LighthouseServer(bind="127.0.0.1:0", min_replicas=1) as lh:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        pg = _SlowToStart()
        manager = Manager(
            pg,
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lh.address(),
            replica_id="slow",
            init_sync=False,
            connect_timeout=T,
        )
        try:
            assert pg.waiting.wait(10), "the Manager never waited for its group's start-up"
            assert _live(lh) == []  # not live: nobody's quorum waits for it
            pg.started.set()
            manager.start_quorum()
            manager.wait_quorum()
            assert [r.split(":")[0] for r in _live(lh)] == ["slow"]
            assert manager.should_commit()
        finally:
            pg.started.set()
            manager.shutdown()
