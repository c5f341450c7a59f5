"""Two Gloo replica groups as threads of one process: group b fails a step after
its collective (group a commits it), heals, and both train on; then the process
exits (for test_reaper_exit). It must exit 0: a retired backend whose op waited
for the peer's backend used to hold the one reaper thread for the op's whole
timeout, and the exit meanwhile aborted the process from Gloo's I/O thread."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
from torch.distributed import TCPStore

from lighthouse import LighthouseServer
from torchft_pg import ProcessGroupGloo
from torchft_pg.manager import Manager

STEPS = 12
FAIL_AT = 5  # b's attempt that fails after its collective


def group(lighthouse: str, name: str) -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=20)
    manager = Manager(
        ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=name,
        timeout=timeout,
        quorum_timeout=timeout,
        load_state_dict=lambda _: None,
        state_dict=lambda: {},
    )
    try:
        for attempt in range(STEPS * 3):  # bounded: failed attempts add a few
            manager.start_quorum()
            manager.allreduce(torch.ones(1)).wait()
            if name == "b" and attempt == FAIL_AT:
                manager.report_error(RuntimeError("injected: this group's step fails"))
            manager.should_commit()
            if manager.current_step() >= STEPS:
                break
    finally:
        manager.shutdown(wait=False)
    print(f"{name} done at step {manager.current_step()}", flush=True)


def main() -> None:
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, http_bind=None
    )
    threads = [threading.Thread(target=group, args=(lighthouse.address(), name)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    lighthouse.shutdown()


if __name__ == "__main__":
    main()
