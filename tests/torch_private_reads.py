"""Where a module's source reads a private part of torch, found on the source (AST).

A read is any of:

- an import of a torch module with a private part (``import torch._C``,
  ``from torch._C._distributed_c10d import Work``), or of a private name from a
  torch module (``from torch.distributed.distributed_c10d import _world``);
- an attribute ``x._name`` (read or written) where ``_name`` is a private name
  torch defines (`torch_private_names`), unless ``x`` is ``self``, ``cls`` or
  ``super()`` and torchft_pg defines ``_name`` itself (its own attribute, or an
  override of torch's method: defining one is not reading it);
- a string constant that is such a name (``getattr(pg, "_set_default_timeout")``).

Shared by the import-direction rule (no module outside
``torchft_pg._torch_internals`` reads one) and the internals test (every name
that package reads is in its table).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrivateRead", "names_defined_in", "private_reads", "torch_private_names"]

# The torch objects whose private names count: the modules and classes torchft_pg
# works with. Every class of torch._C._distributed_c10d (and its nested classes,
# e.g. the backends' Options) is added to these.
TORCH_OWNERS = (
    "torch",
    "torch._C",
    "torch.UntypedStorage",
    "torch.Tensor",
    "torch.futures",
    "torch.futures.Future",
    "torch.nn.Module",
    "torch.optim.Optimizer",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.distributed",
    "torch.distributed.Backend",
    "torch.distributed.distributed_c10d",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor.placement_types",
    "torch.distributed.fsdp",
)
C10D_EXTENSION = "torch._C._distributed_c10d"


@dataclass(frozen=True)
class PrivateRead:
    """One read: the private `name` at `line`, and the source `text` that reads it."""

    line: int
    name: str
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.text}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _find(dotted: str) -> object | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for part in parts[end:]:
            found = getattr(found, part, None)
            if found is None:
                return None
        return found
    return None


def torch_private_names() -> frozenset[str]:
    """The private names (``_x``, not dunders) of the torch objects in `TORCH_OWNERS`
    and of every class of the c10d extension, as the installed torch defines them."""
    owners = [o for o in map(_find, (*TORCH_OWNERS, C10D_EXTENSION)) if o is not None]
    extension = _find(C10D_EXTENSION)
    for name in dir(extension):
        value = getattr(extension, name)
        if inspect.isclass(value):
            owners.append(value)
            owners += [v for n in dir(value) if inspect.isclass(v := getattr(value, n, None))]
    return frozenset(n for owner in owners for n in dir(owner) if _is_private(n))


def names_defined_in(paths: list[Path]) -> frozenset[str]:
    """Every name the sources at `paths` define: functions, classes, assigned
    names, and attributes assigned on ``self`` or ``cls``."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                found.add(node.attr)
    return frozenset(found)


def _is_own_receiver(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def private_reads(
    source: str, torch_private: frozenset[str], defined: frozenset[str]
) -> list[PrivateRead]:
    """The reads of private torch parts in `source` (see the module docstring).

    `torch_private`: from `torch_private_names`; `defined`: the names the
    package defines itself, from `names_defined_in`.
    """
    reads: list[PrivateRead] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torch" and any(_is_private(p) for p in parts):
                    reads.append(PrivateRead(node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            if parts[0] != "torch":
                continue
            private_module = any(_is_private(p) for p in parts)
            for alias in node.names:
                if private_module or _is_private(alias.name):
                    text = f"from {node.module} import {alias.name}"
                    reads.append(PrivateRead(node.lineno, alias.name, text))
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if not _is_private(name) or name not in torch_private:
                continue
            if _is_own_receiver(node.value) and name in defined:
                continue
            reads.append(PrivateRead(node.lineno, name, ast.unparse(node)))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _is_private(node.value)
            and node.value in torch_private
        ):
            reads.append(PrivateRead(node.lineno, node.value, repr(node.value)))
    return sorted(reads, key=lambda r: (r.line, r.text))
