"""LocalSGD and DiLoCo against a real Manager with a fake quorum client and group.

The group (`PeerGroup`) plays a two-replica world whose other replica sends a
constant: every allreduce adds `PEER` to the tensor, and the Manager divides
the sum by its 2 participants. Each test replays the same training with plain
torch (no Manager, no hooks) and compares parameters, backups and outer
optimizer state after every sync.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from tests.unit.manager_fakes import FakeClient, FakeTransport, HeldWork, SumGroup, result
from torchft_pg.local_sgd import DiLoCo, LocalSGD, extract_local_tensor
from torchft_pg.manager import Manager
from torchft_pg.work import completed_work

PEER = 1.0  # what the simulated other replica contributes to every allreduce


class PeerGroup(SumGroup):
    """SUM with one simulated peer that always sends `PEER` (see module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.peer = PEER

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        self.calls += 1
        if self.hold:
            fut: Future[Any] = Future()

            def add_peer(_: Future[Any]) -> None:
                for t in tensors:
                    t.add_(self.peer)

            fut.add_done_callback(add_peer)
            self.pending.append(fut)
            return HeldWork(fut)
        for t in tensors:
            t.add_(self.peer)
        return completed_work(tensors)


def make_manager(
    decisions: list[bool] | None = None,
    use_async_quorum: bool = False,
    results: list[Any] | None = None,
    transport: FakeTransport | None = None,
) -> tuple[Manager, FakeClient, PeerGroup]:
    client = FakeClient(results or [result(world=2)], decisions)
    pg = PeerGroup()
    manager = Manager(
        pg,
        client=client,
        connect_manager=lambda addr: client,
        checkpoint_transport=transport or FakeTransport(),
        use_async_quorum=use_async_quorum,
        timeout=timedelta(seconds=5),
    )
    return manager, client, pg


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g)


def inner_step(model: torch.nn.Module, inner: torch.optim.Optimizer, step: int) -> None:
    x, y = batch(step)
    inner.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()


def make_inner(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def make_outer(params: Iterator[torch.nn.Parameter] | list[torch.nn.Parameter]) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def fragments_of(model: torch.nn.Sequential, n: int) -> list[torch.nn.Module]:
    return [model] if n == 1 else [model[0], model[2]]


def params_of(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def assert_same(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-7)


# -- LocalSGD ----------------------------------------------------------------------


def test_local_sgd_averages_every_sync_every_steps_and_keeps_local_params_on_failure() -> None:
    decisions = [True, False, True]
    manager, client, pg = make_manager(decisions=list(decisions), use_async_quorum=True)
    model = make_model()
    inner = make_inner(model)
    ref = make_model()
    ref_inner = make_inner(ref)
    n_params = len(list(model.parameters()))
    with LocalSGD(manager, model, inner, sync_every=3) as local_sgd:
        for step in range(9):
            inner_step(model, inner, step)
            inner_step(ref, ref_inner, step)
            if (step + 1) % 3 == 0 and decisions[step // 3]:
                with torch.no_grad():
                    for p in ref.parameters():
                        p.add_(PEER).div_(2)
            assert_same(params_of(model), params_of(ref))
            assert local_sgd._local_step == (step + 1) % 3
            assert len(client.votes) == (step + 1) // 3
            assert pg.calls == n_params * ((step + 1) // 3)
    assert manager.current_step() == 2
    # the inner optimizer's state is each group's own: LocalSGD leaves it alone
    assert inner.state_dict()["state"].keys() == ref_inner.state_dict()["state"].keys()
    # once exited, steps no longer sync
    inner_step(model, inner, 9)
    assert len(client.votes) == 3
    manager.shutdown()


def test_local_sgd_rejects_bad_sync_every() -> None:
    manager, _, _ = make_manager()
    model = make_model()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
            LocalSGD(manager, model, make_inner(model), sync_every=bad)  # type: ignore[arg-type]
    manager.shutdown()


def test_local_sgd_cannot_be_entered_twice() -> None:
    manager, _, _ = make_manager()
    model = make_model()
    local_sgd = LocalSGD(manager, model, make_inner(model), sync_every=2)
    with local_sgd, pytest.raises(RuntimeError, match="already entered"):
        local_sgd.__enter__()
    manager.shutdown()


# -- DiLoCo reference ---------------------------------------------------------------


class ReferenceDiLoCo:
    """DiLoCo replayed with plain torch for the simulated two-replica world."""

    def __init__(self, n_fragments: int, sync_every: int, delay: int, alpha: float) -> None:
        self.model = make_model()
        self.inner = make_inner(self.model)
        self.fragments = fragments_of(self.model, n_fragments)
        self.interval = sync_every // n_fragments
        self.delay, self.alpha = delay, alpha
        self.global_params = [
            [torch.nn.Parameter(p.detach().clone()) for p in f.parameters()] for f in self.fragments
        ]
        self.outer = [make_outer(g) for g in self.global_params]
        self.step = 0  # committed syncs
        self.local_step = 0
        self.pending: tuple[int, list[torch.Tensor]] | None = None
        self.allreduces = 0

    def train(self, t: int, commit: Callable[[], bool]) -> None:
        inner_step(self.model, self.inner, t)
        self.local_step += 1
        if self.local_step == self.interval - self.delay:
            f = self.step % len(self.fragments)
            pseudo = [
                g.detach() - p.detach()
                for g, p in zip(self.global_params[f], self.fragments[f].parameters(), strict=True)
            ]
            self.pending = (f, [(x + PEER) / 2 for x in pseudo])
            self.allreduces += len(pseudo)
        if self.local_step == self.interval:
            self.local_step = 0
            assert self.pending is not None
            f, avg = self.pending
            params = list(self.fragments[f].parameters())
            with torch.no_grad():
                if commit():
                    for g, a in zip(self.global_params[f], avg, strict=True):
                        g.grad = a
                    self.outer[f].step()
                    for p, g in zip(params, self.global_params[f], strict=True):
                        local = p.detach().clone()
                        p.copy_(g)
                        if self.alpha > 0:
                            p.lerp_(local, self.alpha)
                    self.step += 1
                else:
                    for p, g in zip(params, self.global_params[f], strict=True):
                        p.copy_(g)


@pytest.mark.parametrize(
    ("n_fragments", "sync_every", "delay", "alpha"),
    [(1, 3, 0, 0.0), (1, 3, 2, 0.0), (2, 4, 0, 0.0), (2, 4, 1, 0.25), (2, 6, 2, 1.0)],
)
def test_diloco_matches_the_replayed_math(
    n_fragments: int, sync_every: int, delay: int, alpha: float
) -> None:
    decisions = [True, True, False, True, True, True, False, True, True]
    manager, client, pg = make_manager(decisions=list(decisions))
    model = make_model()
    fragments = fragments_of(model, n_fragments)
    outer = [make_outer(f.parameters()) for f in fragments]
    inner = make_inner(model)
    ref = ReferenceDiLoCo(n_fragments, sync_every, delay, alpha)
    ref_decisions = iter(decisions)
    interval = sync_every // n_fragments
    with DiLoCo(
        manager,
        fragments,
        inner,
        outer,
        sync_every=sync_every,
        fragment_sync_delay=delay,
        fragment_update_alpha=alpha,
    ) as diloco:
        for t in range(len(decisions) * interval):
            inner_step(model, inner, t)
            ref.train(t, lambda: next(ref_decisions))
            assert_same(params_of(model), params_of(ref.model))
            # one quorum per sync, started `delay` steps before it
            assert len(client.requests) == (t + 1 + delay) // interval
            assert len(client.votes) == (t + 1) // interval
            for f, fragment in enumerate(diloco._fragments):
                assert_same(
                    list(fragment.original_parameters.values()),
                    params_of_globals(ref.global_params[f]),
                )
    assert manager.current_step() == ref.step == decisions.count(True)
    for o, r in zip(outer, ref.outer, strict=True):
        assert_same(momenta(o), momenta(r))
    assert pg.calls == ref.allreduces  # one per parameter of each syncing fragment
    manager.shutdown()


def params_of_globals(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach() for p in params]


def momenta(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        optimizer.state[p]["momentum_buffer"]
        for group in optimizer.param_groups
        for p in group["params"]
    ]


def test_diloco_failed_commit_puts_the_backup_back_and_leaves_the_outer_state() -> None:
    manager, client, _ = make_manager(decisions=[True, False])
    model = make_model()
    outer = make_outer(model.parameters())
    inner = make_inner(model)
    with DiLoCo(manager, [model], inner, outer, sync_every=2) as diloco:
        for t in range(2):
            inner_step(model, inner, t)
        assert client.votes == [(0, True)]
        backup = [t.clone() for t in diloco._fragments[0].original_parameters.values()]
        assert_same(params_of(model), backup)  # alpha 0: the new global parameters
        outer_state = copy.deepcopy(outer.state_dict())
        inner_step(model, inner, 2)
        moved = params_of(model)
        assert all(not torch.equal(m, b) for m, b in zip(moved, backup, strict=True))
        inner_step(model, inner, 3)  # sync: the vote fails
    assert [step for step, _ in client.votes] == [0, 1]
    assert manager.current_step() == 1  # the second sync did not commit
    assert_same(params_of(model), backup)
    assert_same(list(diloco._fragments[0].original_parameters.values()), backup)
    torch.testing.assert_close(outer.state_dict(), outer_state)
    assert all(p.grad is None for p in model.parameters())  # as after a committed sync
    manager.shutdown()


def test_diloco_outer_step_leaves_no_gradient_behind() -> None:
    manager, _, _ = make_manager()
    model = make_model()
    inner = make_inner(model)
    with DiLoCo(manager, [model], inner, make_outer(model.parameters()), sync_every=1):
        inner_step(model, inner, 0)
    assert all(p.grad is None for p in model.parameters())
    manager.shutdown()


def test_shared_outer_optimizer_steps_only_the_syncing_fragment() -> None:
    manager, _, _ = make_manager()
    model = make_model()
    inner = make_inner(model)
    outer = make_outer(model.parameters())  # one optimizer over both fragments
    with DiLoCo(manager, [model[0], model[2]], inner, outer, sync_every=2) as diloco:
        inner_step(model, inner, 0)  # fragment 0 syncs
        first_grads = [p.grad for p in model[2].parameters()]
        untouched = params_of(model[2])
        assert all(g is not None for g in first_grads)
    assert_same(params_of(model[2]), untouched)
    assert [p.grad for p in model[2].parameters()] == first_grads  # the same tensors, put back
    assert all(p.grad is None for p in model[0].parameters())
    assert set(outer.state) == set(model[0].parameters())
    assert len(diloco._fragments) == 2
    manager.shutdown()


def test_bucketized_allreduce_gives_the_same_result_in_fewer_calls() -> None:
    runs = []
    for bucketize in (False, True):
        manager, _, pg = make_manager()
        model = make_model()
        inner = make_inner(model)
        outer = make_outer(model.parameters())
        with DiLoCo(manager, [model], inner, outer, sync_every=2, use_bucketization=bucketize):
            for t in range(6):
                inner_step(model, inner, t)
        runs.append((params_of(model), pg.calls))
        manager.shutdown()
    (plain, plain_calls), (bucketed, bucketed_calls) = runs
    assert_same(bucketed, plain)
    assert plain_calls == 3 * 4 and bucketed_calls == 3


def test_tiny_buckets_split_by_size() -> None:
    manager, _, pg = make_manager()
    model = make_model()  # parameters of 12, 4, 8 and 2 floats
    inner = make_inner(model)
    with DiLoCo(
        manager,
        [model],
        inner,
        make_outer(model.parameters()),
        sync_every=1,
        use_bucketization=True,
        bucket_cap_mb=48 / 2**20,  # 48 bytes: 12 floats
    ):
        inner_step(model, inner, 0)
    assert pg.calls == 3  # [12] [4, 8] [2]
    manager.shutdown()


def test_delayed_sync_overlaps_the_allreduce_with_inner_steps() -> None:
    manager, client, pg = make_manager()
    pg.hold = True
    model = make_model()
    inner = make_inner(model)
    with DiLoCo(
        manager, [model], inner, make_outer(model.parameters()), sync_every=3, fragment_sync_delay=2
    ):
        inner_step(model, inner, 0)  # starts the quorum and the allreduce, does not wait
        assert len(client.requests) == 1 and len(pg.pending) == len(list(model.parameters()))
        inner_step(model, inner, 1)  # trains while the allreduce is in flight
        assert client.votes == []
        for fut in pg.pending:
            fut.set_result(None)
        inner_step(model, inner, 2)  # the sync point: waits, votes, outer step
    assert client.votes == [(0, True)]
    manager.shutdown()


class SnapshotTransport(FakeTransport):
    """Keeps a deep copy of what it is asked to send, as the HTTP transport's snapshot does."""

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
    ) -> None:
        super().send_checkpoint(dst_ranks, step, copy.deepcopy(state_dict), timeout)


def two_fragment_diloco(
    manager: Manager, seed: int
) -> tuple[torch.nn.Sequential, torch.optim.Optimizer, list[torch.optim.SGD], DiLoCo]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    inner = make_inner(model)
    outer = [make_outer(model[0].parameters()), make_outer(model[2].parameters())]
    return model, inner, outer, DiLoCo(manager, [model[0], model[2]], inner, outer, sync_every=2)


def test_healing_replica_takes_the_backup_and_outer_state() -> None:
    transport = SnapshotTransport()
    source, _, _ = make_manager(
        results=[result(world=2), result(world=2), result(world=2, dst=[1], max_step=2)],
        transport=transport,
    )
    model, inner, _, src_diloco = two_fragment_diloco(source, seed=0)
    with src_diloco:
        for t in range(3):  # one fragment syncs per step: 2 syncs, then one that serves a heal
            inner_step(model, inner, t)
    assert [(dst, step) for dst, step, _ in transport.sent] == [([1], 2)]
    payload = transport.sent[0][2]
    assert set(payload["user"]) == {"StreamingDiLoCoFragment_0", "StreamingDiLoCoFragment_1"}
    assert payload["torchft"]["step"] == 2

    healer, _, _ = make_manager(
        results=[
            result(world=2, replica_rank=1, max_step=2, max_rank=0, heal=True, src=0),
            result(world=2, replica_rank=1, max_step=2),
        ],
        transport=FakeTransport(copy.deepcopy(payload)),  # the healer owns what it receives
    )
    model, inner, outer, diloco = two_fragment_diloco(healer, seed=1)  # other weights
    with diloco:
        inner_step(model, inner, 0)  # the quorum heals before the pseudo-gradient
    assert healer.current_step() == 3  # healed to step 2, then committed fragment 0's sync

    # fragment 1 did not sync: exactly the source's backup and momentum
    theirs = payload["user"]["StreamingDiLoCoFragment_1"]
    assert_same(
        list(diloco._fragments[1].original_parameters.values()),
        list(theirs["original_parameters"].values()),
    )
    assert_same(
        momenta(outer[1]),
        [theirs["outer_optimizer"]["state"][i]["momentum_buffer"] for i in (0, 1)],
    )
    # fragment 0 synced: one outer step from the source's backup and momentum,
    # on the pseudo-gradient of this replica's own (unhealed) local weights
    theirs = payload["user"]["StreamingDiLoCoFragment_0"]
    ref_model, ref_inner, _, _ = two_fragment_diloco(make_manager()[0], seed=1)
    inner_step(ref_model, ref_inner, 0)
    glob = [torch.nn.Parameter(t.clone()) for t in theirs["original_parameters"].values()]
    ref_outer = make_outer(glob)
    ref_outer.load_state_dict(theirs["outer_optimizer"])
    for g, p in zip(glob, ref_model[0].parameters(), strict=True):
        g.grad = (g.detach() - p.detach() + PEER) / 2
    ref_outer.step()
    assert_same(list(diloco._fragments[0].original_parameters.values()), [g.detach() for g in glob])
    assert_same(momenta(outer[0]), momenta(ref_outer))
    source.shutdown()
    healer.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"sync_every": 3},
            ValueError,
            r"sync_every \(3\) must be a multiple of len\(model_fragments\) \(2\)",
        ),
        ({"sync_every": 1}, ValueError, r"sync_every \(1\) must be a multiple"),
        ({"sync_every": 0}, ValueError, "sync_every must be an int >= 1, got 0"),
        (
            {"fragment_sync_delay": 2},
            ValueError,
            r"fragment_sync_delay must be an int in \[0, .* = 2\), got 2",
        ),
        ({"fragment_sync_delay": -1}, ValueError, "got -1"),
        (
            {"fragment_update_alpha": 1.5},
            ValueError,
            r"fragment_update_alpha must be in \[0, 1\], got 1.5",
        ),
        (
            {"should_quantize": True, "quantization": "fp4"},
            ValueError,
            r"quantization must be one of \['int8', 'bf16'\], got 'fp4'",
        ),
        ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb must be > 0, got 0"),
        ({"outer": 3}, ValueError, "got 3 outer optimizers for 2 model fragments"),
        (
            {"overlap": True},
            ValueError,
            "parameter '0.weight' of model fragment 1 is also in fragment 0",
        ),
    ],
)
def test_diloco_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    manager, _, _ = make_manager()
    model = make_model()
    fragments: list[torch.nn.Module] = [model[0], model[2]]
    if kwargs.pop("overlap", False):
        fragments = [model[0], model]
    outer: Any = make_outer(model.parameters())
    n_outer = kwargs.pop("outer", None)
    if n_outer is not None:
        outer = [make_outer(model.parameters()) for _ in range(n_outer)]
    args = {"sync_every": 4, **kwargs}
    with pytest.raises(error, match=match):
        DiLoCo(manager, fragments, make_inner(model), outer, **args)
    manager.shutdown()


def test_diloco_needs_a_synchronous_quorum() -> None:
    manager, _, _ = make_manager(use_async_quorum=True)
    model = make_model()
    with pytest.raises(ValueError, match="use_async_quorum=False"):
        DiLoCo(manager, [model], make_inner(model), make_outer(model.parameters()), sync_every=2)
    manager.shutdown()


def test_extract_local_tensor_is_a_detached_copy() -> None:
    t = torch.rand(3, 3, requires_grad=True)
    copy_ = extract_local_tensor(t)
    assert torch.equal(copy_, t) and copy_.data_ptr() != t.data_ptr()
    assert not copy_.requires_grad and copy_.grad is None
