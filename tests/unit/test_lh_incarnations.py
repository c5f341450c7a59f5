"""The lighthouse's incarnation bindings, without sockets: who may use a replica id."""

from __future__ import annotations

import pytest

from lighthouse import auth
from lighthouse.coordinator.incarnations import Incarnations

OWNER = "a" * 32
OTHER = "b" * 32


def test_the_first_token_binds_the_id_and_every_other_token_or_none_is_refused() -> None:
    inc = Incarnations()
    assert inc.admit("rep0:1", OWNER, known=False) is None  # the owner's first call
    assert inc.is_bound("rep0:1")
    assert inc.admit("rep0:1", OWNER, known=True) is None
    for stranger in (OTHER, None):
        why = inc.admit("rep0:1", stranger, known=True)
        assert why is not None and "'rep0:1'" in why and "another incarnation" in why
        assert OWNER not in why and OTHER not in why  # never echoes a token
    assert inc.admit("rep0:1", OWNER, known=True) is None  # refusals changed nothing


def test_ids_are_bound_independently_and_one_incarnation_may_own_several() -> None:
    inc = Incarnations()
    assert inc.admit("a:1", OWNER, known=False) is None
    assert inc.admit("b:1", OTHER, known=False) is None
    assert inc.admit("c:1", OWNER, known=False) is None
    assert inc.admit("b:1", OWNER, known=True) is not None
    assert inc.admit("c:1", OWNER, known=True) is None
    assert len(inc) == 3


def test_an_id_never_used_with_a_token_stays_open_to_token_less_callers() -> None:
    inc = Incarnations()
    for _ in range(3):  # e.g. torchft's client, one per call
        assert inc.admit("torchft", None, known=True) is None
    assert not inc.is_bound("torchft")
    # ...and is unprotected: the first caller with a token takes it.
    assert inc.admit("torchft", OTHER, known=True) is None
    assert inc.admit("torchft", None, known=True) is not None


def test_a_forgotten_id_is_unbound_so_a_new_incarnation_may_take_it() -> None:
    inc = Incarnations()
    inc.admit("rep0:1", OWNER, known=False)
    # The lighthouse forgot it (dead, left, pruned) before anyone else asked.
    assert inc.admit("rep0:1", OTHER, known=False) is None
    assert inc.admit("rep0:1", OWNER, known=True) is not None
    assert inc.forget("rep0:1") and not inc.forget("rep0:1")
    assert inc.admit("rep0:1", None, known=True) is None


def test_retain_drops_the_bindings_of_forgotten_ids_only() -> None:
    inc = Incarnations()
    for rid in ("a", "b", "c"):
        inc.admit(rid, OWNER, known=False)
    assert inc.retain(lambda rid: rid != "b") == ["b"]
    assert len(inc) == 2 and not inc.is_bound("b")
    assert inc.retain(lambda rid: True) == []


@pytest.mark.parametrize(
    "token",
    ["", "short", "x" * 129, "has space in it here", "ünïcode-token-value-1234"],
)
def test_a_malformed_token_is_refused_naming_it(token: str) -> None:
    inc = Incarnations()
    with pytest.raises(ValueError, match="16 to 128 characters from"):
        inc.admit("rep0", token, known=False)
    assert not inc.is_bound("rep0")


def test_a_non_str_token_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a str, got int"):
        auth.check_incarnation(7)  # type: ignore[arg-type]


def test_new_incarnations_are_valid_and_distinct() -> None:
    tokens = {auth.new_incarnation() for _ in range(100)}
    assert len(tokens) == 100
    for t in tokens:
        assert auth.check_incarnation(t) == t and len(t) == 32


def test_call_metadata_carries_the_token_and_incarnation_of_reads_it() -> None:
    md = auth.call_metadata("s" * 16, "job", OWNER)
    assert md is not None and (auth.INCARNATION_KEY, OWNER) in md
    assert auth.incarnation_of(md) == OWNER
    assert auth.incarnation_of([(auth.INCARNATION_KEY, OWNER.encode())]) == OWNER
    assert auth.incarnation_of(auth.call_metadata("s" * 16)) is None
    assert auth.call_metadata(None, None, None) is None
