"""One single-rank replica group for the network-namespace tests, run in its host's namespace.

``python -m tests.chaos.netns_worker '<WorkerConfig as JSON>'`` trains a small
MLP with torchft_pg's Manager, DDP and OptimizerWrapper, as the chaos trainer
(`tests.chaos_support.trainer`) does, but with every address taken from its
config: its group store, its manager server and its HTTP heal transport bind
and advertise `host`, the namespace's only address, and nothing is told
127.0.0.1. (The chaos trainer binds its stores to 127.0.0.1, which another
namespace cannot reach.)

It talks to the test over its standard streams. Stdout carries one JSON
object per line (`"ev"` names it): ``ready``, then per step ``step`` (the
step voted on, whether it committed, the quorum, the participants and a
digest of the state after a commit), and at the end ``done`` with the final
step and checksum, or ``error``. Stdin carries commands, one per line:
``go`` (start training) and ``finish <step>`` (stop at the first commit at or
past that step in which every replica took part). Logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

__all__ = ["WorkerConfig", "main"]


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Times in seconds."""

    replica: int
    host: str  # this namespace's address: every server binds and advertises it
    lighthouse: str  # host:port
    expected_replicas: int
    hidden: int = 32
    seed: int = 0
    timeout_s: float = 5.0  # process group ops, heals
    quorum_timeout_s: float = 60.0
    connect_timeout_s: float = 30.0
    step_time_s: float = 0.05  # simulated compute, so the replicas stay roughly in step
    pg: str = "gloo"  # or "baby"
    # How the Manager learns `host`: "arg" (hostname=), "env" (TORCHFT_HOSTNAME) or
    # "none" (not at all: what a job that forgets it gets)
    hostname_via: str = "arg"
    # The group store's host as the Manager is told it (MASTER_ADDR): "host", or
    # "localhost" as `torchrun --standalone` sets it
    store_addr: str = "host"
    log_level: int = logging.WARNING

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        return cls(**json.loads(text))


_out_lock = threading.Lock()


def emit(ev: str, **fields: Any) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps({"ev": ev, "at": time.time(), **fields}) + "\n")
        sys.stdout.flush()


def _read_commands(commands: queue.Queue[str]) -> None:
    for line in sys.stdin:  # ends when the test closes our stdin
        commands.put(line.strip())
    commands.put("eof")


def train(c: WorkerConfig) -> None:
    import torch
    from torch.distributed import TCPStore

    from tests.chaos_support.workload import state_checksum  # the harness's own digest
    from torchft_pg import DistributedDataParallel, Manager, OptimizerWrapper
    from torchft_pg.process_group import ProcessGroup, ProcessGroupBabyGloo, ProcessGroupGloo

    timeout = timedelta(seconds=c.timeout_s)
    torch.manual_seed(c.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, c.hidden), torch.nn.ReLU(), torch.nn.Linear(c.hidden, 1)
    )
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    if c.hostname_via == "env":
        os.environ["TORCHFT_HOSTNAME"] = c.host
    # The group's store: the lighthouse hands `host:port` to the other replicas as
    # the rendezvous store of the cross-replica group.
    store_host = c.host if c.store_addr == "host" else c.store_addr
    store = TCPStore(
        store_host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    pg: ProcessGroup
    if c.pg == "baby":
        # The Baby group has no `hostname` option: its child's Gloo takes torch's
        # own setting, the interface to use.
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        pg = ProcessGroupBabyGloo(timeout=timeout)
    else:
        pg = ProcessGroupGloo(timeout, hostname=c.host)
    manager = Manager(
        pg,
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr=store_host,
        store_port=store.port,
        lighthouse_addr=c.lighthouse,
        replica_id=f"replica{c.replica}",
        hostname=c.host if c.hostname_via == "arg" else None,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=c.quorum_timeout_s),
        connect_timeout=timedelta(seconds=c.connect_timeout_s),
    )
    manager.register_state_dict_fn("model", model.load_state_dict, model.state_dict)
    manager.register_state_dict_fn("optim", optim.load_state_dict, optim.state_dict)
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, optim)
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_commands, args=(commands,), daemon=True).start()
    emit("ready", pid=os.getpid())
    if commands.get(timeout=120) != "go":
        raise RuntimeError("expected 'go' first")
    finish_at: int | None = None
    try:
        while True:
            while not commands.empty():
                command = commands.get_nowait()
                if command.startswith("finish "):
                    finish_at = int(command.split()[1])
                elif command == "eof":
                    raise RuntimeError("the test closed our stdin")
            step = manager.current_step()
            if c.step_time_s:
                time.sleep(c.step_time_s)  # simulated compute, not synchronization
            opt.zero_grad()
            gen = torch.Generator().manual_seed(c.seed * 1_000_003 + c.replica * 10_007 + step)
            x = torch.randn(8, 16, generator=gen)
            loss = torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            step = manager.current_step()  # after the quorum and any heal: the step voted on
            opt.step()
            committed = manager.current_step() > step
            epoch, quorum_id = manager.quorum_id()
            errored = manager.errored()
            emit(
                "step",
                replica=c.replica,
                step=step,
                committed=committed,
                quorum=f"{epoch}/{quorum_id}",
                participants=manager.num_participants(),
                digest=state_checksum(model.state_dict(), optim.state_dict())
                if committed
                else None,
                error=str(errored.original_exception)[:300] if errored is not None else None,
            )
            if (
                committed
                and finish_at is not None
                and manager.current_step() >= finish_at
                and manager.num_participants() >= c.expected_replicas
            ):
                break
        emit(
            "done",
            replica=c.replica,
            step=manager.current_step(),
            checksum=state_checksum(model.state_dict(), optim.state_dict()),
        )
    finally:
        manager.shutdown(wait=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config = WorkerConfig.from_json(argv[0])
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s replica{config.replica} %(name)s %(message)s",
    )
    try:
        train(config)
    except BaseException as e:
        emit("error", replica=config.replica, message=f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
