"""Network faults between hosts: the lighthouse and each replica group in its own network namespace.

Hosts are joined through a hub (`tests/chaos/netns.py`) and have only an
address in 198.18.0.0/15, so every server must bind and advertise that
address: nothing here may assume 127.0.0.1. Each test runs a real lighthouse
(`python -m lighthouse`) and single-rank replica groups
(`tests/chaos/netns_worker.py`), injects a fault in the hub, and checks the
chaos supervisor's invariants (`tests/chaos/netns_job.py`): no step
committed in two quorums, no replica's step going backwards, the same state
after every step and at the end, every wait bounded by a deadline.

Needs root and `ip netns add`; skipped visibly otherwise.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tests.chaos.netns import Network, available, die_with_parent
from tests.chaos.netns_job import LH_HOST, LH_PORT, Job, ReplicaCrashed, hosts
from tests.chaos.netns_worker import WorkerConfig

_WHY = available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

REPLICAS = 3
TIMEOUT_S = 3.0  # process group ops and configure, heals


def workers(net: Network, **overrides: object) -> Callable[[int], WorkerConfig]:
    def config(i: int) -> WorkerConfig:
        fields: dict[str, object] = {
            "replica": i,
            "host": net.addr(f"r{i}"),
            "lighthouse": f"{net.addr(LH_HOST)}:{LH_PORT}",
            "expected_replicas": REPLICAS,
            "timeout_s": TIMEOUT_S,
        }
        fields.update(overrides.get(f"r{i}", {}))  # type: ignore[call-overload]
        return WorkerConfig(**fields)  # type: ignore[arg-type]

    return config


@pytest.fixture
def net() -> Iterator[Network]:
    with Network(hosts(REPLICAS)) as n:
        yield n
    assert not n.leftovers(), f"namespaces left behind: {n.leftovers()}"


def warm_up(job: Job, steps: int = 3) -> None:
    job.wait(
        lambda: job.all_in_step(0) and job.ledger.max_step() >= steps,
        60,
        f"every replica to commit together up to step {steps}",
    )


def test_network_teardown_removes_everything_even_on_failure() -> None:
    n = Network(hosts(1))
    with pytest.raises(RuntimeError, match="boom"), n:
        assert sorted(n.leftovers()) == sorted([n.hub, n.ns(LH_HOST), n.ns("r0")])
        raise RuntimeError("boom")
    assert n.leftovers() == []
    veths = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert n.tag not in veths.stdout


def test_hosts_reach_each_other_only_by_their_bench_addresses(net: Network) -> None:
    """The topology the other tests rely on: peers are reachable at their 198.18/15
    address, a partition silently drops packets, and healing it restores them."""
    probe = (
        "import socket,sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], 9), timeout=float(sys.argv[2])).close()\n"
        "    print('open')\n"
        "except ConnectionRefusedError:\n"
        "    print('refused')\n"  # the host answered: reachable, nothing listening
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )

    def reach(src: str, dst: str, timeout_s: float) -> str:
        argv = [sys.executable, "-c", probe, net.addr(dst), str(timeout_s)]
        out = subprocess.run(net.exec_argv(src, argv), capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    assert reach("r0", "r1", 5) == "refused"
    assert reach("r0", LH_HOST, 5) == "refused"
    net.block("r0", LH_HOST)
    assert reach("r0", LH_HOST, 1) == "TimeoutError"  # dropped, not refused
    assert reach(LH_HOST, "r0", 1) == "TimeoutError"
    assert reach("r0", "r1", 5) == "refused"  # the other paths are untouched
    assert net.dropped(LH_HOST) > 0 and net.dropped("r0") > 0
    net.unblock("r0", LH_HOST)
    assert reach("r0", LH_HOST, 5) == "refused"


def test_replica_partitioned_from_the_lighthouse_is_excluded_and_heals(net: Network) -> None:
    """Replica 2 loses the lighthouse but not its peers. The lighthouse stops
    hearing it, so the other two go on without it; once the partition ends it
    rejoins, heals to their step and trains with them again.

    The replicas also learn their address in the three ways a job can give it:
    replica 0 is told its group store is at ``localhost`` (as ``torchrun
    --standalone`` sets MASTER_ADDR), replica 1 reads ``TORCHFT_HOSTNAME``,
    replica 2 gets ``hostname=``."""
    config = workers(net, r0={"store_addr": "localhost"}, r1={"hostname_via": "env"})
    with Job(net, replicas=REPLICAS, worker=config) as job:
        warm_up(job)
        cut = time.time()
        net.block("r2", LH_HOST)
        job.say(f"partition: r2 <-> lighthouse at step {job.ledger.max_step()}")

        def majority_without_r2() -> bool:
            return all(
                sum(1 for s in job.ledger.commits(i, cut) if s.participants == 2) >= 5
                for i in (0, 1)
            )

        took = job.wait(majority_without_r2, 40, "replicas 0 and 1 to commit 5 steps without r2")
        job.say(f"the majority went on without r2 after {took:.1f} s")
        assert net.dropped(LH_HOST) > 0 and net.dropped("r2") > 0
        net.unblock("r2", LH_HOST)
        healed = time.time()
        others_at = max(job.ledger.last[0], job.ledger.last[1])
        took = job.wait(lambda: job.all_in_step(healed), 60, "r2 to rejoin after the partition")
        job.say(f"r2 back in step {took:.1f} s after the partition ended")
        # It healed to the others' step (a jump), rather than training through the gap.
        first_after = job.ledger.commits(2, healed)[0].step
        assert first_after >= others_at, (first_after, others_at)
        job.finish()


@pytest.mark.slow  # 30-45 s each: the CI plan keeps one partition scenario
@pytest.mark.xfail(
    strict=False,  # it needs a Gloo connect attempt still pending when the partition heals
    raises=ReplicaCrashed,
    reason="native crash: a Gloo configure that failed with 'Connect timeout' during the "
    "partition leaves a connect attempt behind; when the partition heals it is refused "
    "(the peer's listener is gone) and Gloo throws from its loop thread: "
    "'terminate called after throwing gloo::EnforceNotMet ... tcp/pair.cc:1065 "
    "ex_ == nullptr' (SIGABRT), the worker dies (seen in about half the runs)",
)
def test_partition_between_replicas_is_survived(net: Network) -> None:
    """Replicas 1 and 2 lose each other but not the lighthouse or replica 0.
    Every quorum holding both fails (their Gloo pair cannot connect); nothing
    may be committed twice or diverge, and once the partition ends all three
    train together again and end with the same state. (Any other failure than
    a replica's native crash fails the test.)"""
    with Job(net, replicas=REPLICAS, worker=workers(net)) as job:
        warm_up(job)
        cut = time.time()
        start_step = job.ledger.max_step()
        net.block("r1", "r2")
        job.say(f"partition: r1 <-> r2 at step {start_step}")

        # Hold it until replica 0 has failed three rounds (each a collective or
        # configure timing out) or trained on without one side (rule 8 cut it out).
        def partition_felt() -> bool:
            mine = [s for s in job.ledger.steps if s.replica == 0 and s.at >= cut]
            return sum(1 for s in mine if not s.committed) >= 3 or any(
                s.committed and s.participants == 2 for s in mine
            )

        job.wait(partition_felt, 40, "replica 0 to fail three steps or train on without one side")
        during = {i: len(job.ledger.commits(i, cut)) for i in range(REPLICAS)}
        job.say(f"commits during the partition: {during}")
        assert net.dropped("r1") > 0 and net.dropped("r2") > 0
        net.unblock("r1", "r2")
        healed = time.time()
        took = job.wait(lambda: job.all_in_step(healed), 60, "all three to train together again")
        job.say(f"back in step {took:.1f} s after the partition ended")
        job.finish()


@pytest.mark.slow  # 30-45 s each: the CI plan keeps one partition scenario
def test_majority_keeps_committing_during_a_partition_between_replicas(net: Network) -> None:
    """With replicas 1 and 2 cut from each other, {0, 1} (or {0, 2}) is a connected
    majority that can train on: after the failed step each of 1 and 2 names the
    other unreachable, the lighthouse cuts one out (rule 8), and a quorum of the
    rest commits within four process-group timeouts of the partition (one to see
    the step fail, one probe, two to spare). The lighthouse's join timeout is 1 s
    here, so a side is not left out merely by asking a few hundred ms late."""
    with Job(net, replicas=REPLICAS, join_timeout_ms=1000, worker=workers(net)) as job:
        warm_up(job)
        cut = time.time()
        net.block("r1", "r2")
        try:
            job.wait(
                lambda: any(
                    s.participants == 2 for i in range(REPLICAS) for s in job.ledger.commits(i, cut)
                ),
                4 * TIMEOUT_S,
                "a majority to commit without one side of the partition",
            )
        finally:
            net.unblock("r1", "r2")


def test_gloo_configure_with_a_silently_unreachable_peer_fails_within_its_timeout() -> None:
    """Two ranks meet at a store both reach, but every packet between them is dropped
    (a partition, or a host that went dark): configure must fail within about its
    timeout, as it does when the peer refuses the connection."""
    timeout_s = 2.0
    with Network(hosts(2)) as n:
        procs: list[subprocess.Popen[str]] = []
        try:
            store_argv = [sys.executable, "-m", "tests.chaos.netns_probe", "store"]
            store_argv += [n.addr(LH_HOST), "29600"]
            procs.append(_popen(n.exec_argv(LH_HOST, store_argv)))
            assert _line(procs[0]) == "up"
            n.block("r0", "r1")
            for rank in range(2):
                argv = [sys.executable, "-m", "tests.chaos.netns_probe", "configure"]
                argv += [n.addr(f"r{rank}"), f"{n.addr(LH_HOST)}:29600/probe", str(rank)]
                argv += ["2", str(timeout_s)]
                procs.append(_popen(n.exec_argv(f"r{rank}", argv)))
            assert [_line(p) for p in procs[1:]] == ["ready", "ready"]
            for p in procs[1:]:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = [json.loads(_line(p)) for p in procs[1:]]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)  # `ip netns exec` execs: p.pid is the probe
                p.communicate(timeout=10)
    for r in results:
        assert r["error"] is not None and "Timeout" in r["error"], r
        assert r["elapsed_s"] < 2 * timeout_s, (
            f"configure with timeout {timeout_s} s took {r['elapsed_s']:.1f} s: {r['error']}"
        )


def _popen(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=die_with_parent,
    )


def _line(p: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """The next line `p` prints, or AssertionError after `timeout_s` seconds."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout_s)
    assert ready, f"pid {p.pid} printed nothing within {timeout_s} s"
    return p.stdout.readline().strip()


@pytest.mark.slow  # 30-45 s each: the CI plan keeps one partition scenario
def test_short_training_run_over_slow_lossy_links(net: Network) -> None:
    """50 ms one-way delay and 1% loss on every link (`tc netem`, or the userspace
    link emulator where the kernel has no netem): the job keeps committing, and
    every replica ends with the same state."""
    with Job(net, replicas=REPLICAS, worker=workers(net, **_all(timeout_s=10.0))) as job:
        warm_up(job)
        how = net.impair(delay_ms=50, loss_pct=1)
        cut = time.time()
        start_step = job.ledger.max_step()
        took = job.wait(
            lambda: job.ledger.max_step() >= start_step + 15,
            90,
            "15 steps over the impaired links",
        )
        failed = sum(1 for s in job.ledger.steps if s.at >= cut and not s.committed)
        job.say(f"15 steps in {took:.1f} s with {how}; {failed} step attempts failed")
        job.finish(timeout_s=90)
        said = net.unimpair()
        job.say(f"links restored ({how}): {said}")


def _all(**fields: object) -> dict[str, dict[str, object]]:
    return {f"r{i}": dict(fields) for i in range(REPLICAS)}
