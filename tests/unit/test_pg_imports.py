"""What importing the package and its process groups loads, in a fresh interpreter.

A Baby group's child process imports ``torchft_pg.process_group`` at start-up
(``python -m torchft_pg.process_group.baby.child``); it must not pay for the
Manager, grpc or the lighthouse servers: of the lighthouse it loads only
``lighthouse.errors``, the root of its exception tree (and the package's lazy
``__init__``). ``import torchft_pg`` alone loads nothing: public names are
imported on first use.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchft_pg

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120  # a cold `import torch` can take tens of seconds

# The public names of the package root (those it had when it imported eagerly, and XCCL).
PUBLIC = [
    "DistributedDataParallel",
    "ErrorSwallowingProcessGroupWrapper",
    "FaultToleranceError",
    "ManagedProcessGroup",
    "Manager",
    "NotConfiguredError",
    "Optimizer",
    "OptimizerWrapper",
    "ProcessGroup",
    "ProcessGroupAbortedError",
    "ProcessGroupBaby",
    "ProcessGroupBabyGloo",
    "ProcessGroupBabyNCCL",
    "ProcessGroupBabyXCCL",
    "ProcessGroupDummy",
    "ProcessGroupError",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupTimeoutError",
    "ProcessGroupWrapper",
    "ProcessGroupXCCL",
    "WorldSizeMode",
    "create_store_client",
    "extend_device_mesh",
    "ft_init_device_mesh",
]

CONTROL_PLANE = ("grpc", "lighthouse", "torchft_pg.manager", "torchft_pg.checkpointing")


def _loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running `statement`."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=True,
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def _under(modules: list[str], *prefixes: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_importing_the_package_loads_nothing_else() -> None:
    loaded = _loaded_after("import torchft_pg")
    assert _under(loaded, *CONTROL_PLANE, "torch") == []
    assert _under(loaded, "torchft_pg") == ["torchft_pg"]


@pytest.mark.parametrize(
    "statement",
    [
        "import torchft_pg.process_group",
        "import torchft_pg.process_group.baby.child",  # what a Baby child runs
    ],
)
def test_process_groups_do_not_load_the_manager(statement: str) -> None:
    loaded = _loaded_after(statement)
    assert _under(loaded, "torchft_pg.manager", "torchft_pg.checkpointing") == []


@pytest.mark.parametrize(
    "statement",
    ["import torchft_pg.process_group", "import torchft_pg.process_group.baby.child"],
)
def test_process_groups_do_not_load_grpc_or_the_lighthouse(statement: str) -> None:
    # Only the exception root (torchft_pg.errors extends it) and the package's
    # lazy `__init__` that importing it runs: no gRPC, no lighthouse server or client.
    loaded = _loaded_after(statement)
    assert _under(loaded, "grpc") == []
    assert _under(loaded, "lighthouse") == ["lighthouse", "lighthouse.errors"]


def test_every_module_a_process_group_starts_a_process_with_exists() -> None:
    """A child or zygote is started by module path (``python -m ...``): a path left
    behind by a move would fail only at run time, in the child. Every dotted
    ``torchft_pg.`` string in the process-group sources must name a module."""
    named = {
        node.value
        for path in sorted((ROOT / "torchft_pg" / "process_group").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"torchft_pg(\.\w+)+", node.value)
    }
    assert "torchft_pg.process_group.baby.child" in named  # what a Baby child runs
    assert [name for name in sorted(named) if importlib.util.find_spec(name) is None] == []


@pytest.mark.parametrize(
    "name",
    [
        "FaultToleranceError",
        "LighthouseUnavailableError",
        "ManagerUnavailableError",
        "QuorumRejectedError",
        "QuorumTimeoutError",
    ],
)
def test_the_control_plane_errors_are_the_same_classes_everywhere(name: str) -> None:
    """The root lives in `lighthouse.errors` and torchft_pg.errors re-exports it; a
    lighthouse error must still be caught by torchft_pg's names and vice versa."""
    import lighthouse
    import lighthouse.errors
    import torchft_pg.errors

    cls = getattr(lighthouse.errors, name)
    assert getattr(lighthouse, name) is cls
    assert getattr(torchft_pg.errors, name) is cls
    assert issubclass(cls, torchft_pg.errors.FaultToleranceError)
    assert issubclass(torchft_pg.errors.ProcessGroupError, lighthouse.FaultToleranceError)


def test_public_names_resolve_on_first_use_and_are_the_modules_own() -> None:
    from torchft_pg import Manager, ProcessGroupBabyGloo, ProcessGroupGloo
    from torchft_pg.manager import Manager as ManagerItself
    from torchft_pg.optim import OptimizerWrapper
    from torchft_pg.process_group import ProcessGroupBabyGloo as BabyItself
    from torchft_pg.process_group import ProcessGroupGloo as GlooItself

    assert Manager is ManagerItself
    assert ProcessGroupGloo is GlooItself and ProcessGroupBabyGloo is BabyItself
    assert torchft_pg.Optimizer is torchft_pg.OptimizerWrapper is OptimizerWrapper
    for name in PUBLIC:
        assert getattr(torchft_pg, name) is not None, name


def test_all_and_dir_list_the_public_names() -> None:
    assert torchft_pg.__all__ == PUBLIC
    assert set(PUBLIC) <= set(dir(torchft_pg))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        torchft_pg.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        from torchft_pg import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401


@pytest.mark.parametrize(
    "statement",
    [
        "from torchft_pg.device_mesh import ft_init_device_mesh",
        "from torchft_pg.process_group import ft_init_device_mesh, extend_device_mesh",
        "import torchft_pg.process_group.base",
    ],
)
def test_each_entry_point_imports_first_in_a_fresh_interpreter(statement: str) -> None:
    # The device-mesh helpers build on the process groups, which also export them:
    # whichever a user imports first, there is no import cycle.
    assert "torchft_pg.process_group" in _loaded_after(statement)
