"""The lighthouse's admission checks, without sockets: capacity, incarnation, streams."""

from __future__ import annotations

from lighthouse.auth import new_incarnation
from lighthouse.coordinator.admission import (
    MAX_STREAMS_PER_REPLICA,
    Admission,
    step_jump,
)


class Known:
    """What the core remembers, as the server's ``knows`` and ``tracked`` read it."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def admission(self, max_tracked: int) -> Admission:
        return Admission(
            max_tracked=max_tracked, knows=self.ids.__contains__, tracked=lambda: len(self.ids)
        )


def test_a_new_id_past_capacity_is_refused_and_logged_once_per_episode() -> None:
    known = Known()
    known.ids |= {"a", "b"}
    adm = known.admission(max_tracked=2)
    first = adm.admit("Quorum", "x", None, "ipv4:1.2.3.4:5")
    assert first is not None and first.kind == "capacity"
    assert first.reason == (
        "Quorum: the lighthouse tracks at most 2 replica ids and has no room for 'x'"
    )
    assert first.log is not None and "first refused: x from ipv4:1.2.3.4:5" in first.log
    second = adm.admit("Heartbeat", "y", None, "p")
    assert second is not None and second.log is None  # the same episode
    assert adm.admit("Quorum", "a", None, "p") is None  # a known id is never refused for room
    assert adm.tick() is None  # still full
    known.ids.discard("b")
    assert adm.tick() == "room for new replica ids again (1 tracked)"
    assert adm.admit("Quorum", "x", None, "p") is None
    known.ids.add("x")
    again = adm.admit("Quorum", "z", None, "p")
    assert again is not None and again.log is not None  # a new episode is logged


def test_another_incarnation_is_refused_and_logged_once_while_the_id_is_remembered() -> None:
    known = Known()
    adm = known.admission(max_tracked=10)
    owner, other = new_incarnation(), new_incarnation()
    assert adm.admit("Quorum", "r", owner, "p") is None  # binds r to the owner's token
    known.ids.add("r")
    assert adm.admit("Heartbeat", "r", owner, "p") is None
    for token in (other, None):
        refusal = adm.admit("Liveness", "r", token, "ipv4:9.9.9.9:1")
        assert refusal is not None and refusal.kind == "incarnation"
        assert refusal.reason.startswith("Liveness: replica id 'r' belongs to another incarnation")
    logged = [adm.admit("Quorum", "r", other, "p") for _ in range(3)]
    assert all(r is not None and r.log is None for r in logged)  # logged once, above
    known.ids.discard("r")  # dead or left: forgotten
    adm.tick()
    assert adm.admit("Quorum", "r", other, "p") is None  # a new owner may bind it


def test_a_malformed_token_is_an_invalid_argument_not_logged() -> None:
    refusal = Known().admission(max_tracked=10).admit("Quorum", "r", "not a token", "p")
    assert refusal is not None and refusal.kind == "malformed" and refusal.log is None
    assert refusal.reason.startswith("Quorum: ")


def test_streams_past_the_limit_are_refused_and_logged_once() -> None:
    known = Known()
    adm = known.admission(max_tracked=10)
    known.ids.add("r")
    assert adm.admit_stream("r", MAX_STREAMS_PER_REPLICA - 1, "p") is None
    refusal = adm.admit_stream("r", MAX_STREAMS_PER_REPLICA, "ipv4:1.1.1.1:2")
    assert refusal is not None and refusal.kind == "streams"
    assert (
        refusal.reason == f"Liveness: {MAX_STREAMS_PER_REPLICA} streams are already open under 'r'"
    )
    assert refusal.log is not None and "from ipv4:1.1.1.1:2" in refusal.log
    later = adm.admit_stream("r", MAX_STREAMS_PER_REPLICA + 1, "p")
    assert later is not None and later.log is None


def test_a_step_jump_is_named_once_the_committed_step_is_known() -> None:
    assert step_jump("r", 50, 0, known=False) is None  # nothing committed or issued yet
    assert step_jump("r", 11, 10, known=True) is None  # the next step is no jump
    line = step_jump("r", 50, 10, known=True)
    assert line is not None and "step 50, far above the job's committed step 10" in line
    assert "(40 steps ahead" in line
