"""The quorum rules, driven by a fake clock (no sockets, no sleeping)."""

from __future__ import annotations

import json

import pytest

from lighthouse.clock import FakeClock
from lighthouse.coordinator.quorum import DecisionKind, QuorumConfig, QuorumState, decide_quorum
from lighthouse.types import QuorumMember

CFG = QuorumConfig(min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=5.0)


def ask(state: QuorumState, clock: FakeClock, rid: str, **kw: object) -> None:
    state.request(QuorumMember(rid, **kw), clock.now())  # type: ignore[arg-type]


def decide_and_issue(
    state: QuorumState, clock: FakeClock, cfg: QuorumConfig = CFG
) -> tuple[DecisionKind, list[str]]:
    d = decide_quorum(clock.now(), state, cfg)
    if d.members is None:
        return d.kind, []
    q = state.issue(d.members, clock.now(), 0)
    return d.kind, q.replica_ids


def test_decision_kinds_are_the_stable_tags() -> None:
    # /status, the logs, the dashboard and QuorumWait carry these plain strings.
    assert [k.value for k in DecisionKind] == [
        "fast",
        "ready",
        "idle",
        "min_replicas",
        "split_brain",
        "join_timeout",
        "shrink_empty",
        "behind",
        "below_committed",
        "quarantine",
    ]
    assert json.dumps({"kind": DecisionKind.BELOW_COMMITTED.value}) == '{"kind": "below_committed"}'


def test_first_quorum_waits_for_min_replicas_and_says_why() -> None:
    clock, state = FakeClock(), QuorumState("e")
    ask(state, clock, "a")
    d = decide_quorum(clock.now(), state, CFG)
    assert d.members is None and d.kind is DecisionKind.MIN_REPLICAS
    assert "min_replicas=2" in d.reason
    ask(state, clock, "b")
    assert decide_and_issue(state, clock) == (DecisionKind.READY, ["a", "b"])
    assert state.quorum_id == 1 and state.epoch == "e"


def test_split_brain_guard_needs_strict_majority_of_live_replicas() -> None:
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=5.0)
    for rid in ("a", "b", "c", "d"):
        state.heartbeat(rid, clock.now())
    ask(state, clock, "a")
    ask(state, clock, "b")
    d = decide_quorum(clock.now(), state, cfg)
    assert d.kind is DecisionKind.SPLIT_BRAIN and "strict majority" in d.reason
    clock.advance(100)  # even after any join timeout: 2 of 4 is no majority
    for rid in ("c", "d"):
        state.heartbeat(rid, clock.now())
    state.heartbeat("a", clock.now())
    state.heartbeat("b", clock.now())
    assert decide_quorum(clock.now(), state, cfg).kind is DecisionKind.SPLIT_BRAIN


def test_join_timeout_waits_for_stragglers_then_issues_without_them() -> None:
    clock, state = FakeClock(), QuorumState("e")
    state.heartbeat("c", clock.now())
    ask(state, clock, "a")
    clock.advance(0.5)
    ask(state, clock, "b")
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is DecisionKind.JOIN_TIMEOUT and "1 live replica(s)" in d.reason
    clock.advance(0.49)  # join timeout counts from the earliest ask (a at t=0)
    assert decide_quorum(clock.now(), state, CFG).kind is DecisionKind.JOIN_TIMEOUT
    clock.advance(0.02)
    kind, ids = decide_and_issue(state, clock)
    assert (kind, ids) == (DecisionKind.READY, ["a", "b"])


def test_straggler_silent_past_heartbeat_timeout_no_longer_delays() -> None:
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=2, join_timeout_s=60.0, heartbeat_timeout_s=5.0)
    state.heartbeat("c", clock.now())
    clock.advance(4.0)
    ask(state, clock, "a")
    ask(state, clock, "b")
    assert decide_quorum(clock.now(), state, cfg).kind is DecisionKind.JOIN_TIMEOUT
    clock.advance(1.0)  # c last seen 5 s ago
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["a", "b"])
    assert state.prune(clock.now(), cfg.heartbeat_timeout_s) == ["c"]
    assert "c" not in state.seen


def test_forgotten_replica_dead_by_stream_close_issues_at_once() -> None:
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=2, join_timeout_s=60.0, heartbeat_timeout_s=5.0)
    for rid in "abc":
        ask(state, clock, rid)
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["a", "b", "c"])
    ask(state, clock, "a")
    ask(state, clock, "b")
    assert decide_quorum(clock.now(), state, cfg).kind is DecisionKind.JOIN_TIMEOUT
    assert state.forget("c")
    kind, ids = decide_and_issue(state, clock, cfg)
    assert (kind, ids) == (DecisionKind.READY, ["a", "b"])
    assert state.quorum_id == 2


def test_fast_quorum_same_id_and_admits_registered_joiners() -> None:
    clock, state = FakeClock(), QuorumState("e")
    ask(state, clock, "a")
    ask(state, clock, "b")
    decide_and_issue(state, clock)
    state.heartbeat("x", clock.now())  # heartbeating newcomer: does not delay
    ask(state, clock, "b")
    assert decide_quorum(clock.now(), state, CFG).members is None
    ask(state, clock, "a")
    assert decide_and_issue(state, clock) == (DecisionKind.FAST, ["a", "b"])
    assert state.quorum_id == 1
    ask(state, clock, "c")  # joiner asks before the members do
    ask(state, clock, "a")
    ask(state, clock, "b")
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is DecisionKind.FAST and "1 joiner" in d.reason
    assert decide_and_issue(state, clock) == (DecisionKind.FAST, ["a", "b", "c"])
    assert state.quorum_id == 2


def test_shrink_only_holds_newcomers_back_until_a_normal_quorum() -> None:
    clock, state = FakeClock(), QuorumState("e")
    ask(state, clock, "a")
    ask(state, clock, "b")
    decide_and_issue(state, clock)
    ask(state, clock, "c")
    ask(state, clock, "a", shrink_only=True)
    ask(state, clock, "b")
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is DecisionKind.FAST and "holds 1 newcomer" in d.reason
    assert decide_and_issue(state, clock) == (DecisionKind.FAST, ["a", "b"])
    assert list(state.pending) == ["c"]
    ask(state, clock, "a")
    ask(state, clock, "b")
    assert decide_and_issue(state, clock) == (DecisionKind.FAST, ["a", "b", "c"])


def test_quorum_id_changes_on_commit_failures_only_when_membership_is_same() -> None:
    clock, state = FakeClock(), QuorumState("e")
    for _ in range(3):
        ask(state, clock, "a")
        ask(state, clock, "b")
        decide_and_issue(state, clock)
    assert state.quorum_id == 1
    ask(state, clock, "a", commit_failures=1)
    ask(state, clock, "b")
    decide_and_issue(state, clock)
    assert state.quorum_id == 2


def test_withdrawn_request_is_never_put_into_a_quorum() -> None:
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0)
    for rid in "abc":
        ask(state, clock, rid)
    assert state.withdraw("a") and not state.withdraw("a")
    _kind, ids = decide_and_issue(state, clock, cfg)
    assert ids == ["b", "c"]  # a is still live (a straggler), but never a member


def test_repeated_ask_replaces_and_counts_once() -> None:
    clock, state = FakeClock(), QuorumState("e")
    ask(state, clock, "a", step=1)
    ask(state, clock, "a", step=2)
    assert len(state.pending) == 1 and state.pending["a"].member.step == 2


def test_prune_keeps_pending_requesters_and_bounds_state() -> None:
    clock, state = FakeClock(), QuorumState("e")
    for i in range(1000):
        state.heartbeat(f"dead{i}", clock.now())
    ask(state, clock, "waiting")
    clock.advance(10)
    dead = state.prune(clock.now(), 5.0)
    assert len(dead) == 1000
    assert list(state.seen) == ["waiting"]  # open request is proof of life
    assert state.live_count(clock.now(), 5.0) == 1


def test_decision_reason_for_idle_and_shrink_with_no_previous_members() -> None:
    clock, state = FakeClock(), QuorumState("e")
    assert decide_quorum(clock.now(), state, CFG).kind is DecisionKind.IDLE
    ask(state, clock, "a")
    ask(state, clock, "b")
    decide_and_issue(state, clock)
    state.forget("a")
    state.forget("b")
    ask(state, clock, "c", shrink_only=True)
    ask(state, clock, "d")
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is DecisionKind.SHRINK_EMPTY and d.members is None


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"min_replicas": 0}, "min_replicas must be >= 1, got 0"),
        ({"join_timeout_s": -1}, "join_timeout_s must be >= 0"),
        ({"heartbeat_timeout_s": 0}, "heartbeat_timeout_s must be > 0"),
    ],
)
def test_config_rejects_bad_values(kw: dict[str, float], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        QuorumConfig(**kw)  # type: ignore[arg-type]


def test_fake_clock_only_moves_forward() -> None:
    clock = FakeClock(5.0)
    assert clock.advance(1.5) == 6.5
    with pytest.raises(ValueError, match="seconds must be >= 0, got -1"):
        clock.advance(-1)


def test_never_issues_behind_a_live_replica_that_is_ahead() -> None:
    """Restarted replicas at step 0 must not outvote the live one holding steps 0..85."""
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=5.0)
    ask(state, clock, "a", step=85)
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["a"])
    for rid in ("b", "c", "d"):
        ask(state, clock, rid, step=0)
    clock.advance(10)  # past any join timeout; b, c, d are a majority of 4
    state.heartbeat("a", clock.now())
    d = decide_quorum(clock.now(), state, cfg)
    assert d.members is None and d.kind is DecisionKind.BEHIND
    assert "a (step 85)" in d.reason and "highest step 0" in d.reason
    ask(state, clock, "a", step=86)  # a asks again: everyone is in, b, c, d will heal
    assert decide_and_issue(state, clock, cfg)[1] == ["a", "b", "c", "d"]


def test_a_dead_replica_that_was_ahead_leaves_a_refusal_not_a_silent_reset() -> None:
    """Rule 5 stops waiting for a dead replica; rule 6 still refuses to go below its step."""
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=5.0)
    ask(state, clock, "a", step=8)
    decide_and_issue(state, clock, cfg)
    state.report_progress("a", 9, 1.0)  # a committed step 8 on its lease
    ask(state, clock, "b", step=3)
    ask(state, clock, "c", step=3)
    clock.advance(2)
    assert decide_quorum(clock.now(), state, cfg).kind is DecisionKind.BEHIND
    state.forget("a")  # its liveness stream closed
    d = decide_quorum(clock.now(), state, cfg)
    assert d.members is None and d.kind is DecisionKind.BELOW_COMMITTED
    assert "committed step 9" in d.reason and "highest step is 3" in d.reason
    assert "--allow-step-reset" in d.reason
    allow = QuorumConfig(
        min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=5.0, allow_step_reset=True
    )
    assert decide_and_issue(state, clock, allow) == (DecisionKind.READY, ["b", "c"])
    assert state.committed_step == 3  # the allowed reset is the job's new history


def test_committed_step_survives_in_the_state_and_passes_a_replica_at_that_step() -> None:
    """A restarted lighthouse starts from the recorded step: fresh replicas at 0 are
    refused, a replica that loaded a checkpoint at that step (or later) is not."""
    clock = FakeClock()
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0)
    state = QuorumState("e2", committed_step=500)
    ask(state, clock, "fresh", step=0)
    assert decide_quorum(clock.now(), state, cfg).kind is DecisionKind.BELOW_COMMITTED
    ask(state, clock, "loaded", step=500)
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["fresh", "loaded"])


def test_a_step_reset_refusal_is_final_once_every_live_replica_asks_below_the_step() -> None:
    """Final: the lighthouse has heard from replicas for heartbeat_timeout_s and every
    live replica is asking below the committed step, so the server answers the
    askers now instead of at their deadlines. Not final while a live replica that
    is not asking could still bring the step (e.g. one loading a checkpoint)."""
    clock = FakeClock()
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0)
    state = QuorumState("e", committed_step=40)
    ask(state, clock, "a", step=0)
    ask(state, clock, "b", step=3)
    d = decide_quorum(clock.now(), state, cfg)
    assert (d.kind, d.final) == (DecisionKind.BELOW_COMMITTED, False)  # live ones may still show up
    clock.advance(5)
    state.heartbeat("loading", clock.now())  # live, not asking: may hold step 40
    assert not decide_quorum(clock.now(), state, cfg).final
    state.forget("loading")
    d = decide_quorum(clock.now(), state, cfg)
    assert (d.kind, d.final) == (DecisionKind.BELOW_COMMITTED, True)
    assert "committed step 40" in d.reason
    allow = QuorumConfig(
        min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0, allow_step_reset=True
    )
    assert decide_quorum(clock.now(), state, allow).members is not None


def test_after_a_run_ended_step_0_is_a_new_run_and_an_older_checkpoint_is_refused() -> None:
    clock = FakeClock()
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0)
    state = QuorumState("e", committed_step=500, recalled_members=4, run_ended=True)
    assert state.recalled_members == 0  # rule 3 does not wait for the old run's size
    ask(state, clock, "old", step=200)  # a restart from an older checkpoint
    d = decide_quorum(clock.now(), state, cfg)
    assert d.kind is DecisionKind.BELOW_COMMITTED and "ended cleanly" in d.reason, d.reason
    state.forget("old")
    ask(state, clock, "fresh", step=0)
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["fresh"])
    assert (state.committed_step, state.run_ended) == (0, False)  # the new run's history
    state.report_progress("fresh", 3, 1.0)
    assert state.committed_step == 3
    state.forget("fresh")
    ask(state, clock, "again", step=0)  # not ended (nobody called end_run): refused
    assert decide_quorum(clock.now(), state, cfg).kind is DecisionKind.BELOW_COMMITTED
    state.end_run()
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["again"])


def test_committed_step_grows_with_what_the_quorum_reports_after_it() -> None:
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0)
    ask(state, clock, "a", step=4)
    assert state.committed_step == 0  # a claim, not a committed step
    decide_and_issue(state, clock, cfg)
    assert state.committed_step == 0  # nor is being issued a quorum
    state.report_progress("a", 12, 1.0)  # a ran steps on its lease
    assert state.committed_step == 12
    state.forget("a")
    ask(state, clock, "b", step=11)
    d = decide_quorum(clock.now(), state, cfg)
    assert d.kind is DecisionKind.BELOW_COMMITTED and "committed step 12" in d.reason


def test_a_claim_that_vanishes_leaves_nothing_behind() -> None:
    """One request claiming step 2**62 is taken into a quorum and vanishes: the
    committed step is what the others reach, and they go on at once."""
    clock, state = FakeClock(), QuorumState("e", committed_step=1326)
    for rid in ("a", "b"):
        ask(state, clock, rid, step=1326)
    decide_and_issue(state, clock)
    for rid in ("a", "b"):  # both committed a step together: proven
        ask(state, clock, rid, step=1327)
    assert state.committed_step == 1327 and state.proven == {"a", "b"}
    ask(state, clock, "ghost", step=2**62)
    assert decide_and_issue(state, clock) == (DecisionKind.FAST, ["a", "b", "ghost"])
    assert state.committed_step == 1327  # nobody reported since
    state.withdraw("ghost")  # its deadline passed; it sends nothing more
    for rid in ("a", "b"):  # they could not heal from it: the step failed
        ask(state, clock, rid, step=1327, commit_failures=1)
    assert state.committed_step == 1327  # the ghost never reported: not reached together
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is DecisionKind.QUARANTINE and d.quarantine == ("ghost",), d.reason  # rule 9
    assert "claimed step 4611686018427387904" in d.reason
    state.quarantine(d.quarantine, clock.now(), CFG, d.reason)
    assert decide_and_issue(state, clock) == (DecisionKind.READY, ["a", "b"])  # rule 5 skips it
    state.forget("ghost")  # gone: its quarantine record with it
    assert "ghost" not in state.quarantined and state.committed_step == 1327
    for rid in ("a", "b"):
        ask(state, clock, rid, step=1328)
    assert state.committed_step == 1328


def test_a_member_claiming_ahead_commits_nothing_until_the_others_reach_it() -> None:
    clock, state = FakeClock(), QuorumState("e")
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.0, heartbeat_timeout_s=5.0)
    for rid in ("a", "b", "liar"):
        ask(state, clock, rid, step=5)
    decide_and_issue(state, clock, cfg)
    state.report_progress("liar", 10**9, 1.0)  # a lying ping
    ask(state, clock, "a", step=6)
    assert state.committed_step == 0  # b has not reported
    ask(state, clock, "b", step=5, commit_failures=1)  # b failed the step
    assert state.committed_step == 5  # what all three hold
    state.forget("liar")  # vanishing undoes nothing committed, and adds nothing
    assert state.committed_step == 5
    state.report_progress("a", 6, 1.0)
    ask(state, clock, "b", step=6)
    assert state.committed_step == 6 and "liar" not in state.proven


QCFG = QuorumConfig(
    min_replicas=1,
    join_timeout_s=1.0,
    heartbeat_timeout_s=60.0,
    quarantine_after_failures=3,
    quarantine_base_s=10.0,
)


def _round(state: QuorumState, clock: FakeClock, failures: dict[str, int]) -> tuple[str, list[str]]:
    for rid, cf in failures.items():
        ask(state, clock, rid, step=5, commit_failures=cf)
    d = decide_quorum(clock.now(), state, QCFG)
    if d.quarantine:
        state.quarantine(d.quarantine, clock.now(), QCFG, d.reason)
        return "quarantine:" + ",".join(d.quarantine), []
    if d.members is None:
        return d.kind, []
    return d.kind, state.issue(d.members, clock.now(), 0).replica_ids


def test_a_member_that_breaks_every_step_is_quarantined_with_backoff_and_the_rest_go_on() -> None:
    clock, state = FakeClock(), QuorumState("e")
    assert _round(state, clock, {"a": 0, "b": 0})[1] == ["a", "b"]
    assert _round(state, clock, {"a": 0, "b": 0})[1] == ["a", "b"]  # both committed: proven
    assert _round(state, clock, {"a": 0, "b": 0, "x": 0})[1] == ["a", "b", "x"]  # x joins
    for cf in (1, 2):  # every step with x fails for everyone: not yet attributable
        assert _round(state, clock, {"a": cf, "b": cf, "x": cf})[1] == ["a", "b", "x"]
    assert _round(state, clock, {"a": 3, "b": 3, "x": 3})[0] == "quarantine:x"
    d = decide_quorum(clock.now(), state, QCFG)
    assert d.members is not None and [m.replica_id for m in d.members] == ["a", "b"]
    state.issue(d.members, clock.now(), 0)
    assert state.live_count(clock.now(), 60.0) == 2  # x sits out of the split-brain count too
    # a and b commit without x; x keeps waiting until its backoff ends
    assert _round(state, clock, {"a": 0, "b": 0})[1] == ["a", "b"]
    clock.advance(10.5)
    ask(state, clock, "x", step=5, commit_failures=4)
    assert _round(state, clock, {"a": 0, "b": 0})[1] == ["a", "b", "x"]  # on probation
    for cf in (1, 2):
        _round(state, clock, {"a": cf, "b": cf, "x": cf + 4})
    assert _round(state, clock, {"a": 3, "b": 3, "x": 7})[0] == "quarantine:x"
    q = state.quarantined["x"]
    assert q.strikes == 2 and q.until - clock.now() == 20.0  # doubled
    assert "never committed a step" in q.reason


def test_no_quarantine_when_the_failure_cannot_be_pinned_on_a_member() -> None:
    clock, state = FakeClock(), QuorumState("e")
    _round(state, clock, {"a": 0, "b": 0})
    _round(state, clock, {"a": 0, "b": 0})  # both proven
    for cf in range(1, 6):  # a systemic failure: everyone proven, nobody to blame
        assert _round(state, clock, {"a": cf, "b": cf})[1] == ["a", "b"]
    fresh = QuorumState("e")  # nobody ever committed: nobody is proven either
    for cf in range(0, 6):
        assert _round(fresh, clock, {"c": cf, "d": cf})[1] == ["c", "d"]
    off = QuorumConfig(min_replicas=1, join_timeout_s=1.0, quarantine_after_failures=0)
    assert off.quarantine_after_failures == 0
    with pytest.raises(ValueError, match="quarantine_after_failures must be >= 0, got -1"):
        QuorumConfig(quarantine_after_failures=-1)


def _cut_round(state: QuorumState, clock: FakeClock, cut: dict[str, tuple[str, ...]]) -> str:
    """Every member of {a, b, c} asks after a failed step, naming `cut[rid]` unreachable."""
    for rid in ("a", "b", "c"):
        ask(state, clock, rid, step=5, commit_failures=1, unreachable=cut.get(rid, ()))
    d = decide_quorum(clock.now(), state, QCFG)
    assert d.quarantine, d.reason
    state.quarantine(d.quarantine, clock.now(), QCFG, d.reason)
    return ",".join(d.quarantine)


def _proven_trio() -> tuple[FakeClock, QuorumState]:
    clock, state = FakeClock(), QuorumState("e")
    for _ in range(2):
        assert _round(state, clock, {"a": 0, "b": 0, "c": 0})[1] == ["a", "b", "c"]
    return clock, state


def test_a_partition_between_two_members_cuts_one_out_and_the_majority_trains() -> None:
    """Rule 8: b and c name each other (a reaches both): at the first failed step
    one of them (the higher id on a tie) sits out, and {a, b} is issued."""
    clock, state = _proven_trio()
    assert _cut_round(state, clock, {"b": ("c",), "c": ("b",)}) == "c"
    assert "b <-> c" in state.quarantined["c"].reason
    d = decide_quorum(clock.now(), state, QCFG)
    assert d.members is not None and [m.replica_id for m in d.members] == ["a", "b"], d.reason
    assert state.live_count(clock.now(), 60.0) == 2  # a strict majority of what is left


def test_the_member_behind_or_cut_from_most_is_the_one_left_out() -> None:
    clock, state = _proven_trio()
    # a is cut from both others: removing a alone leaves b and c together
    assert _cut_round(state, clock, {"a": ("b", "c"), "b": ("a",), "c": ("a",)}) == "a"
    clock, state = _proven_trio()
    ask(state, clock, "a", step=5)
    ask(state, clock, "b", step=4, commit_failures=1, unreachable=("c",))
    ask(state, clock, "c", step=5, commit_failures=1, unreachable=("b",))
    d = decide_quorum(clock.now(), state, QCFG)
    assert d.quarantine == ("b",)  # on a tie, the member behind goes


def test_one_sided_reports_and_disabled_quarantine_cut_nobody() -> None:
    clock, state = _proven_trio()
    for rid in ("a", "b", "c"):  # b names c, c does not name b: a liar cannot evict c
        ask(state, clock, rid, step=5, commit_failures=1, unreachable=("c",) if rid == "b" else ())
    d = decide_quorum(clock.now(), state, QCFG)
    assert d.members is not None and len(d.members) == 3 and not d.quarantine
    off = QuorumConfig(min_replicas=1, join_timeout_s=1.0, quarantine_after_failures=0)
    clock, state = _proven_trio()
    for rid, cut in (("a", ()), ("b", ("c",)), ("c", ("b",))):
        ask(state, clock, rid, step=5, commit_failures=1, unreachable=cut)
    d = decide_quorum(clock.now(), state, off)
    assert d.members is not None and len(d.members) == 3


def test_a_restarted_lighthouse_waits_for_a_majority_of_the_last_quorum() -> None:
    """Rule 3 after a restart: the last quorum had 3 members. One replica asking
    alone, before the others reconnect, gets no quorum (it could commit a step the
    others would later commit again without it); two do; after a heartbeat
    timeout without the others, it goes on alone."""
    cfg = QuorumConfig(min_replicas=1, join_timeout_s=0.5, heartbeat_timeout_s=5.0)
    clock = FakeClock()
    state = QuorumState("e2", committed_step=10, recalled_members=3)
    ask(state, clock, "a", step=10)
    d = decide_quorum(clock.now(), state, cfg)
    assert d.kind is DecisionKind.SPLIT_BRAIN and "last quorum before the restart had 3" in d.reason
    ask(state, clock, "b", step=10)
    clock.advance(0.6)  # past the join timeout: the third may be gone
    assert decide_and_issue(state, clock, cfg) == (DecisionKind.READY, ["a", "b"])
    alone = QuorumState("e3", committed_step=10, recalled_members=3)
    ask(alone, clock, "a", step=10)
    assert decide_quorum(clock.now(), alone, cfg).kind is DecisionKind.SPLIT_BRAIN
    clock.advance(5.0)
    alone.heartbeat("a", clock.now())
    assert decide_and_issue(alone, clock, cfg) == (DecisionKind.READY, ["a"])


def _proven_pair(state: QuorumState, clock: FakeClock, step: int) -> None:
    """a and b commit ``step - 1`` together: proven, the job at ``step``."""
    for s in (step - 1, step):
        for rid in ("a", "b"):
            ask(state, clock, rid, step=s)
        if s == step - 1:
            decide_and_issue(state, clock)


def test_a_member_that_earned_its_lead_is_never_refused_when_a_heal_from_it_fails() -> None:
    """Rule 9 refuses claimants only: c joined behind, committed a step the others
    did not (their votes said no), and their heal from it then failed. Refusing c
    would let a and b commit that step again without it: two histories."""
    clock, state = FakeClock(), QuorumState("e")
    _proven_pair(state, clock, 10)
    ask(state, clock, "c", step=0)  # a restarted group: behind, it heals in
    assert decide_and_issue(state, clock) == (DecisionKind.FAST, ["a", "b", "c"])
    assert "c" not in state.claimants
    for rid, step in (("a", 10), ("b", 10), ("c", 11)):  # only c's commit went through
        ask(state, clock, rid, step=step, commit_failures=int(step == 10))
    assert decide_and_issue(state, clock)[1] == ["a", "b", "c"]  # a and b heal from c
    for rid, step in (("a", 10), ("b", 10), ("c", 11)):  # ... and that heal failed
        ask(state, clock, rid, step=step, commit_failures=int(step == 10) * 2)
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is not DecisionKind.QUARANTINE and not state.refuted, d.reason
    assert d.members is not None and len(d.members) == 3  # they try again, with c


def test_after_a_restart_nobody_is_a_claimant_until_steps_are_committed_together() -> None:
    clock = FakeClock()
    state = QuorumState("e2", committed_step=100)
    ask(state, clock, "a", step=5000)  # restored from a newer checkpoint: nothing to compare
    assert state.claimants == set()
    _proven_pair(state, clock, 102)
    ask(state, clock, "late", step=5000)  # far ahead of a and b, who are proven now
    assert state.claimants == {"late"}
    decide_and_issue(state, clock)
    for rid, step in (("a", 5001), ("b", 5001), ("late", 5001)):  # they healed from it
        ask(state, clock, rid, step=step)
    assert state.claimants == set() and state.committed_step == 5001  # proven by that
