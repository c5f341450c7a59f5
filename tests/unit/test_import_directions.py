"""The allowed import directions between packages, checked on the source (AST).

Modules: every ``.py`` file under ``lighthouse/`` (except the
generated ``lighthouse/_gen/``) and ``torchft_pg/``, named by dotted path (a
package by its ``__init__.py``).

Import edges: every ``import X`` and ``from X import Y`` anywhere in a module
(at module level, inside functions, under ``if TYPE_CHECKING:``), relative
imports resolved. ``from P import N`` is an edge to ``P.N`` when that is a
module of ours, else to ``P``. An edge under ``if TYPE_CHECKING:`` is
*type-only*: it never runs. Importing a submodule also runs its parent
packages' ``__init__``; those implicit edges are not counted (a package
``__init__`` is a facade that re-exports), an explicit ``import P`` is.

Roles in ``lighthouse``:

- facades: ``lighthouse`` itself, ``lighthouse.__main__`` and ``lighthouse.testing``;
  they assemble both roles and may import any lighthouse module;
- coordinator: ``lighthouse.coordinator`` and its submodules (the job's lighthouse);
- replica: ``lighthouse.replica`` and its submodules (the per-replica-group side);
- shared: every other lighthouse module (``types``, ``wire``, ``validate``,
  ``errors``, ``clock``, ``services``, ``_net``, ``_calls``, ``_loop``, ...).

Rules:

1. No lighthouse module imports ``torch`` or ``torchft_pg`` (or any submodule).
2. Of lighthouse, a shared module imports only shared modules.
3. Of lighthouse, a coordinator module imports only coordinator and shared modules.
4. Of lighthouse, a replica module imports only replica and shared modules.
   So the two roles meet only in shared modules and in the facades, and no
   module but a facade imports a facade.
5. ``torchft_pg.process_group`` and its submodules never reach ``lighthouse``,
   ``grpc``, ``torchft_pg.manager`` or ``torchft_pg.checkpointing`` (or their
   submodules) at run time: neither directly nor through the torchft_pg
   modules they import, followed transitively over edges that are not
   type-only (a process group, e.g. a Baby child process, must not load them).
   This covers the ``torchft_pg.process_group.baby`` subpackage too.
   The one exception is ``lighthouse.errors``, the root of the exception tree
   that ``torchft_pg.errors`` extends: it imports nothing but ``__future__``
   and the standard library, and the ``lighthouse`` package's ``__init__``,
   which importing it runs, imports nothing but ``__future__`` and the
   standard library at run time (its public names are imported on first use),
   so reaching it loads no gRPC. Both are checked here, on all their edges.
6. The Baby group's modules, in ``torchft_pg.process_group.baby``, are named by
   the side of the process boundary they run on: parent (``group``,
   ``parent``, ``pending``), child (``child``), shared by both ends
   (``messages``, ``protocol``) and the zygote (``zygote``: the parent's
   handle on it and its own loop). A shared module imports only shared
   modules of the package; the child imports only shared modules and the
   zygote (whose loop it starts); the zygote imports shared modules and the
   child (what it forks); a parent module imports anything but the child. No
   torchft_pg module outside the package imports one of its modules: only the
   package itself (its ``__init__``, the public face).
7. No lighthouse or torchft_pg module imports ``tests`` (or any submodule):
   the wheel does not ship it. In particular the shipped fault injection,
   ``torchft_pg.chaos``, never imports the chaos verification built on it
   (``tests.chaos_support``: the reference trainers, the supervisor, the
   oracles); that one imports the shipped part, never the other way.

8. The Manager is a package, ``torchft_pg.manager``, whose ``__init__`` is the
   facade (``Manager``, torchft's import path) over one module per concern
   (its parts). A part never imports the facade: the parts share a
   ``StepState`` instead of calling back into their owner. No torchft_pg
   module outside the package imports a part: only the facade.
9. Only ``torchft_pg._torch_internals`` (and its submodules) reads private parts
   of torch: no other torchft_pg module imports ``torch._C`` (or any torch
   module with a private part), imports a ``_``-name from torch, or reads a
   ``_``-attribute torch defines (see ``tests/torch_private_reads.py`` for what
   counts). Names torch exports publicly come from their public path
   (``torch.distributed.Work``), the rest through ``_torch_internals``. The
   modules in `PRIVATE_TORCH_EXEMPT` are exempt until they are moved.

Rules 1-4 and 6-9 count type-only edges too: they are about which way the code
depends, and a type is a dependency.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.torch_private_reads import (
    names_defined_in,
    private_reads,
    torch_private_names,
)

ROOT = Path(__file__).resolve().parents[2]
FACADES = {"lighthouse", "lighthouse.__main__", "lighthouse.testing"}


@dataclass(frozen=True, kw_only=True)
class Edge:
    """``importer`` imports ``target`` at ``line`` of its source."""

    importer: str
    target: str
    line: int
    type_only: bool = False

    def __str__(self) -> str:
        return f"{self.importer} imports {self.target} (line {self.line})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in ("lighthouse", "torchft_pg"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_gen" not in path.relative_to(ROOT).parts:
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str]) -> list[Edge]:
    """The import edges of ``module`` (its ``source``), resolved as the docstring says."""
    known = set(known)
    package = module if is_package else module.rpartition(".")[0]
    edges: list[Edge] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.append(
                    Edge(importer=module, target=alias.name, line=node.lineno, type_only=type_only)
                )
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                name = sub if sub in known else target
                edges.append(
                    Edge(importer=module, target=name, line=node.lineno, type_only=type_only)
                )
        for inner in ast.iter_child_nodes(node):
            visit(inner, type_only)

    visit(ast.parse(source), False)
    return list(dict.fromkeys(edges))  # one edge per target and line, in source order


def _edges() -> list[Edge]:
    out: list[Edge] = []
    for name, path in MODULES.items():
        out += imports_of(path.read_text(), name, path.name == "__init__.py", MODULES)
    return out


EDGES = _edges()


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _role(name: str) -> str:
    """``facade``, ``coordinator``, ``replica`` or ``shared`` for a lighthouse module."""
    if name in FACADES:
        return "facade"
    if _under(name, "lighthouse.coordinator"):
        return "coordinator"
    if _under(name, "lighthouse.replica"):
        return "replica"
    return "shared"


ALLOWED = {
    "shared": {"shared"},
    "coordinator": {"coordinator", "shared"},
    "replica": {"replica", "shared"},
}


def test_the_layout_has_both_roles_and_the_shared_modules() -> None:
    roles = {_role(m) for m in MODULES if _under(m, "lighthouse")}
    assert roles == {"facade", "coordinator", "replica", "shared"}
    for name in (
        "lighthouse.coordinator.server",
        "lighthouse.replica.server",
        "lighthouse.replica.local",
        "lighthouse.wire",
        "torchft_pg.process_group.base",
        *(f"{BABY}.{module}" for module in BABY_SIDES),
    ):
        assert name in MODULES, name


def test_edges_resolve_relative_and_from_imports() -> None:
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.a", "pkg.sub.b"}
    source = "from . import a\nfrom .a import thing\nfrom pkg import sub, Name\nimport x.y\n"
    got = [(e.target, e.line) for e in imports_of(source, "pkg.sub.b", False, known)]
    assert sorted(got) == [
        ("pkg", 3),
        ("pkg.sub", 3),
        ("pkg.sub.a", 1),
        ("pkg.sub.a", 2),
        ("x.y", 4),
    ]
    inner = "def f():\n    from ..a import z\n"
    assert [e.target for e in imports_of(inner, "pkg.sub", True, known)] == ["pkg.a"]
    typed = "import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\nelse:\n    import pkg\n"
    got_typed = [(e.target, e.type_only) for e in imports_of(typed, "m", False, known)]
    assert got_typed == [("typing", False), ("pkg.a", True), ("pkg", False)]


def test_lighthouse_never_imports_torch_or_torchft_pg() -> None:
    bad = [
        str(e)
        for e in EDGES
        if _under(e.importer, "lighthouse") and _under(e.target, "torch", "torchft_pg")
    ]
    assert bad == []


def test_lighthouse_roles_import_only_their_own_role_and_the_shared_modules() -> None:
    bad = []
    for e in EDGES:
        if not (_under(e.importer, "lighthouse") and _under(e.target, "lighthouse")):
            continue
        role = _role(e.importer)
        if role != "facade" and _role(e.target) not in ALLOWED[role]:
            bad.append(f"{e} ({role} -> {_role(e.target)})")
    assert bad == []


FORBIDDEN_FOR_PG = ("lighthouse", "grpc", "torchft_pg.manager", "torchft_pg.checkpointing")
# The one lighthouse module a process group may reach (rule 5): torch-free and gRPC-free.
ALLOWED_FOR_PG = "lighthouse.errors"


def _reach(start: str, by_importer: dict[str, list[Edge]]) -> list[list[Edge]]:
    """Import chains from ``start`` to a forbidden module, through torchft_pg modules."""
    found: list[list[Edge]] = []
    seen = {start}
    frontier: list[tuple[str, list[Edge]]] = [(start, [])]
    while frontier:
        name, chain = frontier.pop()
        for e in by_importer.get(name, []):
            if e.type_only:
                continue
            if e.target == ALLOWED_FOR_PG:
                continue
            if _under(e.target, *FORBIDDEN_FOR_PG):
                found.append([*chain, e])
            elif e.target in MODULES and e.target not in seen and _under(e.target, "torchft_pg"):
                seen.add(e.target)
                frontier.append((e.target, [*chain, e]))
    return found


def _process_group_reaches_forbidden() -> list[str]:
    by_importer: dict[str, list[Edge]] = {}
    for e in EDGES:
        by_importer.setdefault(e.importer, []).append(e)
    out = []
    for name in sorted(MODULES):
        if _under(name, "torchft_pg.process_group"):
            out += [" -> ".join(map(str, chain)) for chain in _reach(name, by_importer)]
    return out


def test_process_groups_never_reach_the_lighthouse_grpc_the_manager_or_checkpointing() -> None:
    assert _process_group_reaches_forbidden() == []


BABY = "torchft_pg.process_group.baby"
# The Baby group's modules by the side of the process boundary they run on.
BABY_SIDES = {
    "group": "parent",
    "parent": "parent",
    "pending": "parent",
    "child": "child",
    "messages": "shared",
    "protocol": "shared",
    "zygote": "zygote",
}
BABY_ALLOWED = {
    "shared": {"shared"},
    "child": {"shared", "zygote"},
    "zygote": {"shared", "child"},
    "parent": {"parent", "shared", "zygote"},
}


def _side_of(name: str) -> str | None:
    """The side of a module of the Baby package (None for the package itself)."""
    if name == BABY:
        return None
    return BABY_SIDES.get(name[len(BABY) + 1 :].split(".")[0], "unknown")


def test_every_baby_module_says_its_side() -> None:
    found = {name for name in MODULES if _under(name, BABY) and name != BABY}
    assert found == {f"{BABY}.{module}" for module in BABY_SIDES}


def test_baby_modules_import_only_across_their_side_of_the_process_boundary() -> None:
    bad = []
    for e in EDGES:
        if not (_under(e.importer, BABY) and _under(e.target, BABY)) or e.importer == BABY:
            continue
        side, target_side = _side_of(e.importer), _side_of(e.target)
        if target_side is None or target_side not in BABY_ALLOWED[str(side)] | {side}:
            bad.append(f"{e} ({side} -> {target_side or 'the package facade'})")
    assert bad == []


def test_only_the_baby_package_itself_is_imported_from_outside_it() -> None:
    bad = [
        str(e)
        for e in EDGES
        if _under(e.target, BABY) and e.target != BABY and not _under(e.importer, BABY)
    ]
    assert bad == []


def _is_stdlib(name: str) -> bool:
    return name == "__future__" or name.partition(".")[0] in sys.stdlib_module_names


def test_the_lighthouse_module_a_process_group_may_reach_imports_only_the_stdlib() -> None:
    # Rule 5's exception: `lighthouse.errors`, on every edge (type-only included).
    assert ALLOWED_FOR_PG in MODULES
    assert any(e.target == ALLOWED_FOR_PG for e in EDGES if _under(e.importer, "torchft_pg"))
    bad = [str(e) for e in EDGES if e.importer == ALLOWED_FOR_PG and not _is_stdlib(e.target)]
    assert bad == []
    # Importing it runs the package's `__init__`: lazy, only the stdlib at run time.
    init = [e for e in EDGES if e.importer == "lighthouse"]
    assert any(e.type_only for e in init)  # the names type checkers see
    assert [str(e) for e in init if not e.type_only and not _is_stdlib(e.target)] == []


MANAGER = "torchft_pg.manager"


def test_the_managers_parts_never_import_its_facade() -> None:
    parts = [name for name in MODULES if _under(name, MANAGER) and name != MANAGER]
    assert f"{MANAGER}.step_state" in parts and len(parts) >= 10
    bad = [str(e) for e in EDGES if e.importer in parts and e.target == MANAGER]
    assert bad == []


def test_only_the_manager_package_itself_is_imported_from_outside_it() -> None:
    bad = [
        str(e)
        for e in EDGES
        if _under(e.target, MANAGER) and e.target != MANAGER and not _under(e.importer, MANAGER)
    ]
    assert bad == []


def test_no_shipped_module_imports_the_tests() -> None:
    # Rule 7, on every edge (type-only included).
    bad = [str(e) for e in EDGES if _under(e.target, "tests")]
    assert bad == []


def test_the_shipped_chaos_package_exists_and_is_checked() -> None:
    # Rule 7 is about this package in particular: it must stay among the modules read.
    assert {"torchft_pg.chaos", "torchft_pg.chaos.replica_faults"} <= set(MODULES)


INTERNALS = "torchft_pg._torch_internals"
# Modules allowed to read private torch outside the internals package (none): an
# entry no longer needed fails `test_every_exemption_from_the_internals_rule_is_still_needed`.
PRIVATE_TORCH_EXEMPT: dict[str, str] = {}


@functools.cache
def _private_torch_reads() -> dict[str, list[str]]:
    """Each torchft_pg module outside the internals package -> its reads of private torch."""
    ours = [path for name, path in MODULES.items() if _under(name, "torchft_pg")]
    private, defined = torch_private_names(), names_defined_in(ours)
    found = {}
    for name, path in MODULES.items():
        if _under(name, "torchft_pg") and not _under(name, INTERNALS):
            reads = private_reads(path.read_text(), private, defined)
            if reads:
                found[name] = [str(r) for r in reads]
    return found


def test_the_private_torch_scan_finds_imports_attributes_and_names_in_strings() -> None:
    source = (
        "import torch._C._distributed_c10d as c10d_ext\n"
        "from torch._C._distributed_c10d import Work\n"
        "from torch.distributed.distributed_c10d import _world, GroupName\n"
        "from torch.distributed import ProcessGroup\n"
        "def f(pg, storage):\n"
        "    pg._register_backend(1, 2, 3)\n"
        "    setter = getattr(pg, '_set_default_timeout', None)\n"
        "    return storage._share_fd_cpu_()\n"
        "class G(ProcessGroup):\n"
        "    def _source_rank(self):\n"
        "        return self._source_rank() + self._set_group_name('x')\n"
    )
    private = frozenset(
        {
            "_register_backend",
            "_set_default_timeout",
            "_share_fd_cpu_",
            "_source_rank",
            "_set_group_name",
            "_world",
        }
    )
    reads = private_reads(source, private, defined=frozenset({"_source_rank"}))
    assert [(r.line, r.name) for r in reads] == [
        (1, "torch._C._distributed_c10d"),
        (2, "Work"),
        (3, "_world"),
        (6, "_register_backend"),
        (7, "_set_default_timeout"),
        (8, "_share_fd_cpu_"),
        (11, "_set_group_name"),  # an override of our own (_source_rank) is no read
    ]


def test_only_the_torch_internals_package_reads_private_torch() -> None:
    found = _private_torch_reads()
    bad = {name: reads for name, reads in found.items() if name not in PRIVATE_TORCH_EXEMPT}
    assert bad == {}, (
        "read private torch through torchft_pg._torch_internals (a function there that "
        "names what it reads), and public names from their public path, e.g. "
        f"torch.distributed.Work: {bad}"
    )


def test_every_exemption_from_the_internals_rule_is_still_needed() -> None:
    found = _private_torch_reads()
    stale = [name for name in PRIVATE_TORCH_EXEMPT if name not in found]
    assert stale == [], f"no longer read private torch: drop from PRIVATE_TORCH_EXEMPT: {stale}"
