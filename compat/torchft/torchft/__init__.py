"""torchft's import name, served by torchft_pg (the opt-in torchft-pg-compat distribution).

``import torchft`` gives torchft's public names (``Manager``, ``Optimizer``,
``DistributedDataParallel``, ``DistributedSampler``, the process groups), and
``torchft.X`` is the module ``torchft_pg.X`` itself: not a copy, so
``mock.patch("torchft.manager.Manager")`` patches torchft_pg's, and an object's
``type`` is the same whichever name imported it. A torchft module torchft_pg
does not have fails to import with a message naming it.

Installed beside a real torchft this package would silently replace its
``__init__``; importing it then refuses, naming both distributions and the
command that keeps one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from types import ModuleType
from typing import Any

# Distributions that install a real torchft under this import name.
_REAL_TORCHFT = ("torchft", "torchft-nightly")


def _refuse_beside_real_torchft() -> None:
    for dist in _REAL_TORCHFT:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        raise ImportError(
            f"both {dist} {version} and torchft-pg-compat are installed, and both provide the "
            f"import name 'torchft'; keep one: `pip uninstall torchft-pg-compat` to use "
            f"{dist}, or `pip uninstall {dist} torchft-pg-compat && pip install "
            f"./compat/torchft` (from the torchft_pg checkout) to run torchft code on torchft_pg"
        )


_refuse_beside_real_torchft()

_PREFIX = __name__ + "."
_TARGET = "torchft_pg"
# torchft modules whose counterpart has another name: its compiled coordination
# module (``torchft._torchft``; ``torchft.torchft`` in torchft 0.1).
_RENAMED = {
    "torchft._torchft": "torchft_pg.coordination",
    "torchft.torchft": "torchft_pg.coordination",
}


class _Alias(importlib.abc.Loader):
    """Loads ``torchft.X`` by importing ``torchft_pg.X`` and putting that module
    in ``sys.modules`` under the torchft name (the import system returns what
    ``sys.modules`` holds once ``exec_module`` returns)."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder module, replaced in exec_module

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module(self._target)


class _Missing(importlib.abc.Loader):
    """Fails the import of a torchft module torchft_pg does not provide, by name."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        raise ModuleNotFoundError(
            f"{module.__name__} is torchft's, and torchft_pg has no counterpart "
            f"({_TARGET}.{module.__name__[len(_PREFIX) :]} does not exist); see "
            "docs/torchft.md in the torchft_pg repository for what differs from torchft",
            name=module.__name__,
        )


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds every ``torchft.X`` as ``torchft_pg.X``."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PREFIX):
            return None
        ours = _RENAMED.get(fullname, _TARGET + fullname[len(__name__) :])
        try:
            found = importlib.util.find_spec(ours)
        except ModuleNotFoundError:  # a parent of `ours` does not exist
            found = None
        loader: importlib.abc.Loader = _Alias(ours) if found is not None else _Missing()
        return importlib.util.spec_from_loader(
            fullname, loader, is_package=bool(found and found.submodule_search_locations)
        )


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

# torchft's top-level names -> (torchft_pg module, attribute).
_NAMES: dict[str, tuple[str, str]] = {
    "DistributedDataParallel": ("torchft_pg.ddp", "DistributedDataParallel"),
    "DistributedSampler": ("torchft_pg.data", "DistributedSampler"),
    "Manager": ("torchft_pg.manager", "Manager"),
    "Optimizer": ("torchft_pg.optim", "OptimizerWrapper"),
    **{
        name: ("torchft_pg.process_group", name)
        for name in (
            "ProcessGroupBabyGloo",
            "ProcessGroupBabyNCCL",
            "ProcessGroupBabyXCCL",
            "ProcessGroupGloo",
            "ProcessGroupNCCL",
            "ProcessGroupXCCL",
        )
    },
}

__all__ = [
    "DistributedDataParallel",
    "DistributedSampler",
    "Manager",
    "Optimizer",
    "ProcessGroupBabyNCCL",
    "ProcessGroupBabyXCCL",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupXCCL",
]


def __getattr__(name: str) -> Any:
    """A torchft top-level name, or a submodule (``torchft.process_group`` works
    after a bare ``import torchft``, as torchft's own ``__init__`` imports it)."""
    target = _NAMES.get(name)
    if target is not None:
        value = getattr(importlib.import_module(target[0]), target[1])
    elif _PREFIX + name in _RENAMED or (
        not name.startswith("_") and importlib.util.find_spec(f"{_TARGET}.{name}") is not None
    ):
        value = importlib.import_module(_PREFIX + name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
