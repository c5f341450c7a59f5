"""The integrity check's pure parts: fingerprints of state and the verdict on them."""

from __future__ import annotations

import pytest
import torch

from torchft_pg.manager.fingerprint import (
    SLOTS,
    absent_vector,
    fingerprint_state,
    names_in_slots,
    tensor_digest,
    vector_length,
)
from torchft_pg.manager.integrity_check import check_every
from torchft_pg.manager.state_verdict import VerdictKind, judge


def state(seed: int = 0) -> dict[str, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 2))
    return {"default": {"model": model.state_dict(), "meta": 3}}


def flip_bit(t: torch.Tensor, index: int, bit: int) -> None:
    with torch.no_grad():
        t.view(-1).view(torch.int32)[index] ^= 1 << bit


def vec(s: object) -> list[int]:
    return fingerprint_state(s).vector().tolist()


def test_equal_state_gives_equal_fingerprints_and_names_the_tensors() -> None:
    a, b = fingerprint_state(state()), fingerprint_state(state())
    assert a == b
    assert a.names == (
        "default/model/0.weight",
        "default/model/0.bias",
        "default/model/1.weight",
        "default/model/1.bias",
    )
    assert a.vector().shape == (vector_length(),)


@pytest.mark.parametrize("bit", [0, 13, 31])
def test_any_flipped_bit_changes_that_tensors_digest_only(bit: int) -> None:
    s = state()
    before = fingerprint_state(s)
    flip_bit(s["default"]["model"]["1.weight"], 17, bit)  # type: ignore[index]
    after = fingerprint_state(s)
    changed = [
        n for n, x, y in zip(before.names, before.digests, after.digests, strict=True) if x != y
    ]
    assert changed == ["default/model/1.weight"]


def test_swapped_elements_and_odd_sized_tensors_are_covered() -> None:
    t = torch.arange(3000, dtype=torch.float32)
    swapped = t.clone()
    swapped[[5, 2000]] = swapped[[2000, 5]]
    assert tensor_digest(t) != tensor_digest(swapped)
    odd = torch.arange(7, dtype=torch.uint8)  # 7 bytes: no wider word fits
    other = odd.clone()
    other[6] ^= 4
    assert tensor_digest(odd) != tensor_digest(other)
    assert tensor_digest(torch.zeros(3)) != tensor_digest(torch.zeros(4))


def test_more_tensors_than_slots_share_slots_and_a_slot_names_all_its_tensors() -> None:
    many = {f"t{i}": torch.full((2,), float(i)) for i in range(SLOTS + 3)}
    a = fingerprint_state(many)
    many["t1"][0] = -1.0
    diverged = judge([vec(many), a.vector().tolist(), a.vector().tolist()]).diverged
    assert len(diverged) == 1 and diverged[0].slots == (1,)
    assert names_in_slots(a.names, diverged[0].slots) == ["t1", f"t{SLOTS + 1}"]


def test_all_agree_and_absent_members_are_not_compared() -> None:
    v = vec(state())
    verdict = judge([v, absent_vector().tolist(), v])
    assert verdict.kind == VerdictKind.AGREE and verdict.checked == (0, 2)
    assert judge([absent_vector().tolist()]).kind == VerdictKind.AGREE


def test_a_minority_is_named_with_its_differing_slots() -> None:
    good = state()
    bad = state()
    flip_bit(bad["default"]["model"]["0.bias"], 2, 30)  # type: ignore[index]
    verdict = judge([vec(good), vec(bad), absent_vector().tolist(), vec(good)])
    assert verdict.kind == VerdictKind.MINORITY
    assert verdict.majority == (0, 3) and verdict.checked == (0, 1, 3)
    (d,) = verdict.diverged
    assert d.rank == 1 and d.slots == (1,) and not d.count_differs
    assert verdict.trusted(0) and not verdict.trusted(1)
    assert names_in_slots(fingerprint_state(good).names, d.slots) == ["default/model/0.bias"]


def test_a_different_tensor_count_is_a_divergence() -> None:
    good = state()
    verdict = judge([vec(good), vec(good), vec({"x": torch.zeros(1)})])
    assert verdict.kind == VerdictKind.MINORITY and verdict.diverged[0].count_differs


@pytest.mark.parametrize("seeds", [(0, 1), (0, 1, 2), (0, 0, 1, 1)])
def test_without_a_strict_majority_the_verdict_says_so(seeds: tuple[int, ...]) -> None:
    verdict = judge([vec(state(s)) for s in seeds])
    assert verdict.kind == VerdictKind.NO_MAJORITY
    assert verdict.majority == () and not verdict.trusted(0)
    assert {d.rank for d in verdict.diverged} == {r for r, s in enumerate(seeds) if s != seeds[0]}


def test_vectors_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        judge([[1, 0, 0], [1, 0]])


def test_check_every_validates_and_zero_or_none_turns_it_off() -> None:
    assert check_every(None) is None and check_every(0) is None
    assert check_every(7) == 7
    for bad in (-1, 2.5, True, "10"):
        with pytest.raises(ValueError, match=f"integrity_check_every .* got {bad!r}"):
            check_every(bad)  # type: ignore[arg-type]
