"""Every `torch.distributed` call that takes ``group=``, checked numerically on one group.

Each check runs inside every member of a real group. Values a member sends are
functions of its group rank, so each expected result is exact. Global-rank
arguments (``src=``, ``dst=``) go through `Members.global_rank`, so the same
checks cover a group whose ranks differ from the default group's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, kw_only=True)
class Members:
    """This member's view of the group under test.

    `globals_by_rank[i]` is the global rank of group rank i (what ``src=`` and
    ``dst=`` take); `default_group` says whether a default group exists.
    """

    rank: int
    world: int
    globals_by_rank: tuple[int, ...]
    default_group: bool

    def global_rank(self, group_rank: int) -> int:
        return self.globals_by_rank[group_rank]


def _eq(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    want = want.to(got.dtype)
    assert torch.equal(got, want), f"{name}: got {got.tolist()}, want {want.tolist()}"


def _full(value: float, n: int = 4) -> torch.Tensor:
    return torch.full((n,), float(value))


Check = Callable[[dist.ProcessGroup, Members], None]
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    CHECKS[fn.__name__] = fn
    return fn


# -- ranks ----------------------------------------------------------------------------
@check
def get_rank(pg: dist.ProcessGroup, m: Members) -> None:
    if m.default_group:
        assert dist.get_rank(group=pg) == m.rank, (dist.get_rank(group=pg), m.rank)
    assert dist.get_world_size(group=pg) == m.world


@check
def rank_maps(pg: dist.ProcessGroup, m: Members) -> None:
    for i in range(m.world):
        assert dist.get_global_rank(pg, i) == m.global_rank(i)
        assert dist.get_group_rank(pg, m.global_rank(i)) == i
    assert dist.get_process_group_ranks(pg) == list(m.globals_by_rank)


# -- collectives ----------------------------------------------------------------------
@check
def all_reduce(pg: dist.ProcessGroup, m: Members) -> None:
    total = m.world * (m.world + 1) // 2
    t = _full(m.rank + 1)
    dist.all_reduce(t, group=pg)
    _eq("all_reduce", t, _full(total))
    t = _full(m.rank + 1)
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg, async_op=True)
    assert work is not None
    work.wait()
    _eq("all_reduce(MAX, async)", t, _full(m.world))


@check
def all_reduce_coalesced(pg: dist.ProcessGroup, m: Members) -> None:
    a, b = _full(m.rank + 1, 3), _full(10 * (m.rank + 1), 5)
    dist.all_reduce_coalesced([a, b], group=pg)
    total = m.world * (m.world + 1) // 2
    _eq("all_reduce_coalesced[0]", a, _full(total, 3))
    _eq("all_reduce_coalesced[1]", b, _full(10 * total, 5))


@check
def reduce(pg: dist.ProcessGroup, m: Members) -> None:
    root = m.world - 1
    t = _full(m.rank + 1)
    dist.reduce(t, dst=m.global_rank(root), group=pg)
    if m.rank == root:
        _eq("reduce", t, _full(m.world * (m.world + 1) // 2))
    t = _full(m.rank + 1)
    dist.reduce(t, group_dst=0, op=dist.ReduceOp.MAX, group=pg)
    if m.rank == 0:
        _eq("reduce(group_dst, MAX)", t, _full(m.world))


@check
def broadcast(pg: dist.ProcessGroup, m: Members) -> None:
    root = m.world - 1
    t = _full(m.rank + 100)
    dist.broadcast(t, src=m.global_rank(root), group=pg)
    _eq("broadcast(src)", t, _full(root + 100))
    t = _full(m.rank + 200)
    dist.broadcast(t, group_src=0, group=pg)
    _eq("broadcast(group_src)", t, _full(200))


@check
def all_gather(pg: dist.ProcessGroup, m: Members) -> None:
    out = [_full(-1) for _ in range(m.world)]
    dist.all_gather(out, _full(m.rank), group=pg)
    for i, t in enumerate(out):
        _eq(f"all_gather[{i}]", t, _full(i))


@check
def all_gather_into_tensor(pg: dist.ProcessGroup, m: Members) -> None:
    want = torch.arange(m.world, dtype=torch.float32).repeat_interleave(2)
    for fn in (dist.all_gather_into_tensor, dist._all_gather_base):
        out = torch.full((m.world * 2,), -1.0)
        fn(out, _full(m.rank, 2), group=pg)
        _eq(fn.__name__, out, want)
    out2d = torch.full((m.world, 2), -1.0)
    dist.all_gather_into_tensor(out2d, _full(m.rank, 2).unsqueeze(0), group=pg)
    _eq("all_gather_into_tensor(2-D)", out2d.reshape(-1), want)


@check
def all_gather_coalesced(pg: dist.ProcessGroup, m: Members) -> None:
    # One list per member, each holding one tensor per input.
    outs = [[_full(-1, 2), _full(-1, 3)] for _ in range(m.world)]
    dist.all_gather_coalesced(outs, [_full(m.rank, 2), _full(10 * m.rank, 3)], group=pg)
    for i in range(m.world):
        _eq(f"all_gather_coalesced[{i}][0]", outs[i][0], _full(i, 2))
        _eq(f"all_gather_coalesced[{i}][1]", outs[i][1], _full(10 * i, 3))


@check
def gather(pg: dist.ProcessGroup, m: Members) -> None:
    root = m.world - 1
    outs = [_full(-1) for _ in range(m.world)] if m.rank == root else None
    dist.gather(_full(m.rank * 3), outs, dst=m.global_rank(root), group=pg)
    if outs is not None:
        for i, t in enumerate(outs):
            _eq(f"gather[{i}]", t, _full(i * 3))
    outs = [_full(-1) for _ in range(m.world)] if m.rank == 0 else None
    dist.gather(_full(m.rank + 5), outs, group_dst=0, group=pg)
    if outs is not None:
        for i, t in enumerate(outs):
            _eq(f"gather(group_dst)[{i}]", t, _full(i + 5))


@check
def scatter(pg: dist.ProcessGroup, m: Members) -> None:
    root = m.world - 1
    ins = [_full(i * 7) for i in range(m.world)] if m.rank == root else None
    out = _full(-1)
    dist.scatter(out, ins, src=m.global_rank(root), group=pg)
    _eq("scatter", out, _full(m.rank * 7))
    ins = [_full(i + 11) for i in range(m.world)] if m.rank == 0 else None
    out = _full(-1)
    dist.scatter(out, ins, group_src=0, group=pg)
    _eq("scatter(group_src)", out, _full(m.rank + 11))


@check
def reduce_scatter(pg: dist.ProcessGroup, m: Members) -> None:
    out = _full(-1)
    dist.reduce_scatter(out, [_full(m.rank + j) for j in range(m.world)], group=pg)
    _eq("reduce_scatter", out, _full(sum(r + m.rank for r in range(m.world))))


@check
def reduce_scatter_tensor(pg: dist.ProcessGroup, m: Members) -> None:
    want = _full(sum(r + m.rank for r in range(m.world)), 2)
    for fn in (dist.reduce_scatter_tensor, dist._reduce_scatter_base):
        out = _full(-1, 2)
        inp = torch.cat([_full(m.rank + j, 2) for j in range(m.world)])
        fn(out, inp, group=pg)
        _eq(fn.__name__, out, want)


@check
def all_to_all(pg: dist.ProcessGroup, m: Members) -> None:
    outs = [_full(-1, 2) for _ in range(m.world)]
    dist.all_to_all(outs, [_full(m.rank * 10 + j, 2) for j in range(m.world)], group=pg)
    for i, t in enumerate(outs):
        _eq(f"all_to_all[{i}]", t, _full(i * 10 + m.rank, 2))


@check
def all_to_all_single(pg: dist.ProcessGroup, m: Members) -> None:
    inp = torch.arange(m.world, dtype=torch.float32) + m.rank * m.world
    out = torch.full((m.world,), -1.0)
    dist.all_to_all_single(out, inp, group=pg)
    _eq("all_to_all_single", out, torch.arange(m.world, dtype=torch.float32) * m.world + m.rank)
    # Uneven: member r sends j+1 copies of (100 r + j) to member j.
    in_splits = [j + 1 for j in range(m.world)]
    inp = torch.cat([_full(100 * m.rank + j, j + 1) for j in range(m.world)])
    out_splits = [m.rank + 1] * m.world
    out = torch.full((sum(out_splits),), -1.0)
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=pg)
    want = torch.cat([_full(100 * r + m.rank, m.rank + 1) for r in range(m.world)])
    _eq("all_to_all_single(uneven)", out, want)


@check
def barrier(pg: dist.ProcessGroup, m: Members) -> None:
    dist.barrier(group=pg)


# -- point to point -------------------------------------------------------------------
def _ring(m: Members) -> tuple[int, int]:
    return (m.rank + 1) % m.world, (m.rank - 1) % m.world


@check
def send_recv(pg: dist.ProcessGroup, m: Members) -> None:
    dst, src = _ring(m)
    got = torch.zeros(3, dtype=torch.uint8)
    payload = torch.tensor([m.rank, 42, 255], dtype=torch.uint8)
    # Even ranks send first, odd ranks receive first: a ring never deadlocks, also
    # at odd world sizes (the last even rank sends to rank 0, which sends first too,
    # but rank 0's peer receives first).
    if m.rank % 2 == 0:
        dist.send(payload, dst=m.global_rank(dst), group=pg)
        dist.recv(got, src=m.global_rank(src), group=pg)
    else:
        dist.recv(got, group_src=src, group=pg)
        dist.send(payload, group_dst=dst, group=pg)
    _eq("send/recv", got, torch.tensor([src, 42, 255]))


@check
def isend_irecv(pg: dist.ProcessGroup, m: Members) -> None:
    dst, src = _ring(m)
    got = _full(-1, 2)
    recv = dist.irecv(got, src=m.global_rank(src), group=pg)
    send = dist.isend(_full(m.rank, 2), dst=m.global_rank(dst), group=pg)
    assert recv is not None and send is not None
    send.wait()
    recv.wait()
    _eq("isend/irecv", got, _full(src, 2))


@check
def recv_any_source(pg: dist.ProcessGroup, m: Members) -> None:
    # A tag of its own: a receive from any source would also match the next
    # check's messages, which senders may already have sent.
    tag = 7
    if m.rank == 0:
        seen = set()
        for _ in range(m.world - 1):
            got = _full(-1, 1)
            sender = dist.recv(got, group=pg, tag=tag)
            seen.add((sender, int(got.item())))
        want = {(m.global_rank(r), r) for r in range(1, m.world)}
        assert seen == want, (seen, want)
    else:
        dist.send(_full(m.rank, 1), group_dst=0, group=pg, tag=tag)


@check
def batch_isend_irecv(pg: dist.ProcessGroup, m: Members) -> None:
    dst, src = _ring(m)
    got = _full(-1, 3)
    ops = [
        dist.P2POp(dist.isend, _full(m.rank, 3), group=pg, group_peer=dst),
        dist.P2POp(dist.irecv, got, group=pg, group_peer=src),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    _eq("batch_isend_irecv", got, _full(src, 3))


# -- objects --------------------------------------------------------------------------
@check
def all_gather_object(pg: dist.ProcessGroup, m: Members) -> None:
    out: list[object] = [None] * m.world
    dist.all_gather_object(out, {"rank": m.rank, "pad": "x" * m.rank}, group=pg)
    assert out == [{"rank": r, "pad": "x" * r} for r in range(m.world)], out


@check
def broadcast_object_list(pg: dist.ProcessGroup, m: Members) -> None:
    root = m.world - 1
    objs: list[object] = [("from", m.rank), m.rank]
    dist.broadcast_object_list(objs, src=m.global_rank(root), group=pg)
    assert objs == [("from", root), root], objs
    objs = [None]
    if m.rank == 0:
        objs = [{"k": [1, 2]}]
    dist.broadcast_object_list(objs, group_src=0, group=pg)
    assert objs == [{"k": [1, 2]}], objs


@check
def gather_object(pg: dist.ProcessGroup, m: Members) -> None:
    root = m.world - 1
    out: list[object] | None = [None] * m.world if m.rank == root else None
    dist.gather_object(("r", m.rank), out, dst=m.global_rank(root), group=pg)
    if out is not None:
        assert out == [("r", r) for r in range(m.world)], out


@check
def scatter_object_list(pg: dist.ProcessGroup, m: Members) -> None:
    out: list[object] = [None]
    ins = [{"to": r} for r in range(m.world)] if m.rank == 0 else None
    dist.scatter_object_list(out, ins, group_src=0, group=pg)
    assert out == [{"to": m.rank}], out


@check
def send_recv_object_list(pg: dist.ProcessGroup, m: Members) -> None:
    if m.rank == 0:
        dist.send_object_list([{"hello": 1}, "two"], dst=m.global_rank(1), group=pg)
    elif m.rank == 1:
        objs: list[object] = [None, None]
        dist.recv_object_list(objs, src=m.global_rank(0), group=pg)
        assert objs == [{"hello": 1}, "two"], objs


# Checks that need a peer: a group of one member has none to send to.
POINT_TO_POINT = frozenset(
    {"send_recv", "isend_irecv", "recv_any_source", "batch_isend_irecv", "send_recv_object_list"}
)


def run_checks(
    pg: dist.ProcessGroup, members: Members, only: set[str] | None = None
) -> dict[str, str]:
    """Run every check (or `only` those); map each name to "ok" or its error.

    A group of one member skips the point-to-point checks.
    """
    results: dict[str, str] = {}
    for name, fn in CHECKS.items():
        if only is not None and name not in only:
            continue
        if members.world < 2 and name in POINT_TO_POINT:
            continue
        try:
            fn(pg, members)
            results[name] = "ok"
        except Exception as e:
            results[name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return results
