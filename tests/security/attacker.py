"""One attack on a running job, from a process of its own (the security tests start it).

``python -m tests.security.attacker ATTACK --addr HOST:PORT --replica-id ID
[--secret SECRET] [--step N]`` makes the calls of one attack and prints one JSON
line: ``{"outcomes": [...]}``, one entry per call, "accepted" or the refusal
("CODE: details", or the client's error). Nothing here imports torch.

Attacks:
- ``quorum``: quorum requests under ``--replica-id`` at ``--step``, from a
  client with an incarnation token of its own and from one with none.
- ``liveness``: a liveness stream under ``--replica-id`` that pings and then
  announces a clean leave, with no token and with a token of its own, and a
  heartbeat with none.
- ``ghost``: a quorum request at a huge ``--step`` under a new
  ``--replica-id``, with ``--secret`` (if given) as the job secret.
- ``raw``: ONE raw gRPC ``Quorum`` request under a new ``--replica-id`` at
  ``--step`` with a ``--deadline-s`` deadline (the job secret if ``--secret``,
  no incarnation token, a manager address nobody serves), nothing else;
  "accepted" carries the quorum's size: ``accepted: N members``.
- ``vote``: a commit vote of group rank 1 for ``--step`` on the manager server
  at ``--addr``.
- ``flood``: heartbeats under ``--count`` made-up ids (``--replica-id`` + a
  number), each from an incarnation of its own.
- ``streams``: ``--count`` liveness streams under ``--replica-id``, one incarnation,
  all opened at once and held until every one is answered or refused.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial

import grpc

from lighthouse import auth, services, wire
from lighthouse._net import CHANNEL_OPTIONS, normalize_address, stub
from lighthouse.coordinator.client import LighthouseClient
from lighthouse.errors import FaultToleranceError
from lighthouse.replica.client import ManagerClient
from lighthouse.types import QuorumMember

T = timedelta(seconds=3)


def _outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    except FaultToleranceError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def _ask(client: LighthouseClient, rid: str, step: int) -> object:
    """One quorum request under ``rid`` at ``step`` (a one-rank group at a bogus address)."""
    return client.quorum(rid, T, address="127.0.0.1:1", step=step, world_size=1)


def _leave(channel: grpc.Channel, rid: str) -> list[bytes]:
    """A liveness stream under ``rid``: a ping, then a clean-leave announcement."""

    def pings() -> Iterator[bytes]:
        yield wire.encode_liveness_ping(rid)
        yield wire.encode_liveness_ping(rid, leaving=True, step=0)

    return list(stub(channel, services.LIGHTHOUSE_LIVENESS)(pings(), timeout=T.total_seconds()))


def quorum(addr: str, rid: str, secret: str | None, step: int) -> list[str]:
    """Ask under a member's id, as another incarnation and as a token-less client."""
    out = []
    for token in (auth.new_incarnation(), None):
        client = LighthouseClient(addr, T, job_secret=secret, incarnation=token)
        out.append(_outcome(partial(_ask, client, rid, step)))
        client.close()
    return out


def liveness(addr: str, rid: str, secret: str | None) -> list[str]:
    """Open a liveness stream under a member's id and announce its clean leave."""
    out = []
    for token in (None, auth.new_incarnation()):
        channel = auth.sync_channel(
            normalize_address(addr), CHANNEL_OPTIONS, secret, incarnation=token
        )
        out.append(_outcome(partial(_leave, channel, rid)))
        channel.close()
    client = LighthouseClient(addr, T, job_secret=secret)
    out.append(_outcome(lambda: client.heartbeat(rid, T)))
    client.close()
    return out


def ghost(addr: str, rid: str, secret: str | None, step: int) -> list[str]:
    """A new replica claiming a step far ahead of the job."""
    client = LighthouseClient(addr, T, job_secret=secret, incarnation=auth.new_incarnation())
    return [_outcome(partial(_ask, client, rid, step))]


def raw(addr: str, rid: str, secret: str | None, step: int, deadline_s: float) -> list[str]:
    """One raw Quorum call claiming ``step``, as a stranger would send it by hand."""
    channel = auth.sync_channel(normalize_address(addr), CHANNEL_OPTIONS, secret)
    member = QuorumMember(
        rid, address="127.0.0.1:1", store_address="127.0.0.1:1", step=step, world_size=1
    )
    try:
        answer = stub(channel, services.LIGHTHOUSE_QUORUM)(
            wire.encode_lighthouse_quorum_request(member), timeout=deadline_s
        )
    except grpc.RpcError as exc:
        return [f"{exc.code().name}: {exc.details()}"]
    finally:
        channel.close()
    quorum = wire.decode_lighthouse_quorum_response(answer)
    return [f"accepted: {len(quorum.participants)} members"]


def vote(addr: str, secret: str | None, step: int) -> list[str]:
    """Group rank 1 votes yes for a step ahead of the group's open vote."""
    client = ManagerClient(addr, T, job_secret=secret)
    return [_outcome(lambda: client.should_commit(1, step, True, T))]


def flood(addr: str, prefix: str, secret: str | None, count: int) -> list[str]:
    """Heartbeats under ``count`` new ids, as many made-up replicas would send."""
    out = []
    for i in range(count):
        client = LighthouseClient(addr, T, job_secret=secret, incarnation=auth.new_incarnation())
        out.append(_outcome(partial(client.heartbeat, f"{prefix}{i}", T)))
        client.close()
    return out


def streams(addr: str, rid: str, secret: str | None, count: int) -> list[str]:
    """``count`` liveness streams under one id at once: each pings and stays open until
    every one has the lighthouse's first answer (its ack: "accepted") or a refusal."""
    channel = auth.sync_channel(
        normalize_address(addr), CHANNEL_OPTIONS, secret, incarnation=auth.new_incarnation()
    )
    done = threading.Event()

    def pings() -> Iterator[bytes]:
        yield wire.encode_liveness_ping(rid)
        done.wait(T.total_seconds())  # hold the stream open

    calls = [
        stub(channel, services.LIGHTHOUSE_LIVENESS)(pings(), timeout=T.total_seconds())
        for _ in range(count)
    ]
    out = []
    for call in calls:
        try:
            next(call)
            out.append("accepted")
        except grpc.RpcError as exc:
            out.append(f"{exc.code().name}: {exc.details()}")
    done.set()
    for call in calls:
        call.cancel()
    channel.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.security.attacker")
    p.add_argument(
        "attack", choices=["quorum", "liveness", "ghost", "raw", "vote", "flood", "streams"]
    )
    p.add_argument("--addr", required=True)
    p.add_argument("--replica-id", default="")
    p.add_argument("--secret", default=None)
    p.add_argument("--step", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--deadline-s", type=float, default=T.total_seconds())
    a = p.parse_args()
    if a.attack == "quorum":
        outcomes = quorum(a.addr, a.replica_id, a.secret, a.step)
    elif a.attack == "liveness":
        outcomes = liveness(a.addr, a.replica_id, a.secret)
    elif a.attack == "ghost":
        outcomes = ghost(a.addr, a.replica_id, a.secret, a.step)
    elif a.attack == "raw":
        outcomes = raw(a.addr, a.replica_id, a.secret, a.step, a.deadline_s)
    elif a.attack == "flood":
        outcomes = flood(a.addr, a.replica_id, a.secret, a.count)
    elif a.attack == "streams":
        outcomes = streams(a.addr, a.replica_id, a.secret, a.count)
    else:
        outcomes = vote(a.addr, a.secret, a.step)
    print(json.dumps({"outcomes": outcomes}), flush=True)


if __name__ == "__main__":
    main()
