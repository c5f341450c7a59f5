"""torchtitan's fault-tolerance modules on torchft_pg: refuse to run on a changed torch.

The test-only packages (`make install-test-extras`) are installed with
``--no-deps``; if anything changed torch anyway, these tests fail here
instead of testing another torch than the one the project pins.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

COMPAT = Path(__file__).resolve().parents[2] / "compat" / "torchft"
PINNED = re.search(
    r"^TORCH_VERSION \?= (\S+)$",
    (Path(__file__).resolve().parents[2] / "Makefile").read_text(),
    re.MULTILINE,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    if not any(Path(str(item.fspath)).parent == here for item in items):
        return
    assert PINNED is not None, "Makefile has no TORCH_VERSION line"
    installed = torch.__version__.split("+")[0]
    if installed != PINNED.group(1):
        raise pytest.UsageError(
            f"torch is {torch.__version__}, the project pins {PINNED.group(1)}: something "
            "installed another torch; recreate .venv with `make clean install`"
        )
    for name in ("torchtitan", "torchft"):
        if importlib.util.find_spec(name) is None:
            raise pytest.UsageError(
                f"{name} is not installed: run `make install-test-extras` (what `make test` runs)"
            )
    torchft = importlib.util.find_spec("torchft")
    assert torchft is not None and torchft.origin is not None
    if Path(torchft.origin).resolve().parents[1] != COMPAT:
        raise pytest.UsageError(
            f"`import torchft` finds {torchft.origin}, not torchft_pg's compat/torchft: these "
            "tests would run a real torchft"
        )
