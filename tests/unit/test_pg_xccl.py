"""ProcessGroupXCCL and ProcessGroupBabyXCCL (torchft's Intel XPU groups) on a machine
without XCCL or an XPU: they construct as torchft's do, and `configure` fails at
once with an error naming the class and what is missing."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch

import torchft_pg
from torchft_pg import ProcessGroupBabyXCCL, ProcessGroupError, ProcessGroupXCCL
from torchft_pg.process_group import xccl
from torchft_pg.process_group.baby import group as baby_group
from torchft_pg.process_group.reconfigurable import ProcessGroupWrapper

# Nothing listens here: reaching the store at all would fail differently (and later).
UNUSED_ADDR = "127.0.0.1:9/xccl"

MAKERS: dict[str, Callable[[], ProcessGroupWrapper]] = {
    "xccl": lambda: ProcessGroupXCCL(timeout=timedelta(seconds=30)),
    "baby_xccl": lambda: ProcessGroupBabyXCCL(timeout=timedelta(seconds=30)),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_configure_names_the_class_and_what_is_missing(kind: str) -> None:
    missing = xccl.xccl_missing()
    if missing is None:
        pytest.skip("this machine has XCCL and an XPU device")  # never on the CPU test machines
    pg = MAKERS[kind]()
    name = type(pg).__name__
    start = time.monotonic()
    try:
        with pytest.raises(ProcessGroupError) as err:
            pg.configure(UNUSED_ADDR, "0", 0, 2)  # torchft's argument order
        assert time.monotonic() - start < 5.0, "configure met peers before refusing"
        text = str(err.value)
        assert text.startswith(f"{name} cannot configure: it needs XCCL and an Intel XPU")
        assert missing in text
        if not torch.distributed.is_xccl_available():
            assert "built without XCCL" in text and torch.__version__ in text
        if not torch.xpu.is_available():
            assert "no Intel XPU device" in text
        with pytest.raises(ProcessGroupError, match=name):  # and again: nothing was half-built
            pg.configure(UNUSED_ADDR, 0, 2)
    finally:
        pg.shutdown()


def test_a_bad_address_is_still_refused_first() -> None:
    pg = ProcessGroupXCCL()
    with pytest.raises(ValueError, match="store address must be"):
        pg.configure("addr", 0, 1)


def test_only_the_missing_part_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xccl, "_xccl_built", lambda: True)
    monkeypatch.setattr(xccl, "_xpu_available", lambda: False)
    assert xccl.xccl_missing() == "there is no Intel XPU device (torch.xpu.is_available() is False)"
    monkeypatch.setattr(xccl, "_xpu_available", lambda: True)
    assert xccl.xccl_missing() is None


def test_baby_xccl_starts_no_child_and_wait_started_says_why() -> None:
    pg = ProcessGroupBabyXCCL(timeout=timedelta(seconds=30))
    try:
        assert pg.child_pid is None
        assert pg._children.zygote is None  # no interpreter started for a group that cannot run
        with pytest.raises(ProcessGroupError, match="ProcessGroupBabyXCCL cannot configure"):
            pg.wait_started(timedelta(seconds=5))
    finally:
        pg.shutdown()


def test_baby_xccl_where_xccl_exists_says_it_is_not_supported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(baby_group, "xccl_missing", lambda: None)
    pg = ProcessGroupBabyXCCL(timeout=timedelta(seconds=30))
    try:
        with pytest.raises(ProcessGroupError, match="use ProcessGroupXCCL") as err:
            pg.configure(UNUSED_ADDR, 0, 1)
        assert "ProcessGroupBabyXCCL" in str(err.value)
        assert pg.child_pid is None
    finally:
        pg.shutdown()


def test_exported_with_torchft_names_and_backend_names() -> None:
    assert torchft_pg.ProcessGroupXCCL is ProcessGroupXCCL
    assert torchft_pg.ProcessGroupBabyXCCL is ProcessGroupBabyXCCL
    from torchft_pg import process_group

    assert process_group.ProcessGroupXCCL is ProcessGroupXCCL
    assert {"ProcessGroupXCCL", "ProcessGroupBabyXCCL"} <= set(process_group.__all__)
    assert ProcessGroupXCCL().getBackendName() == "torchft-xccl"
    pg = ProcessGroupBabyXCCL()
    try:
        assert pg.getBackendName() == "torchft-baby-xccl"
    finally:
        pg.shutdown()
