"""The lighthouse's gRPC modules pick gRPC's cheaper I/O engine, unless the process chose.

``import lighthouse`` sets nothing (its ``__init__`` is lazy); the first
lighthouse module that uses gRPC sets ``GRPC_EXPERIMENTS`` before ``grpc`` is
imported, through ``lighthouse._grpc``, the one lighthouse module that imports
``grpc``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lighthouse._grpc_env import ENGINE_EXPERIMENTS
from tests.unit.test_import_directions import EDGES, _under

ROOT = Path(__file__).resolve().parents[2]
_REPORT = "print(repr(os.environ.get('GRPC_EXPERIMENTS'))); print('grpc' in sys.modules)"


def _fresh(statement: str, env_value: str | None) -> list[str]:
    """``GRPC_EXPERIMENTS`` and whether grpc is loaded after ``statement``, in a fresh
    interpreter whose variable is ``env_value`` (unset if None)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if env_value is not None:
        env["GRPC_EXPERIMENTS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", f"import os, sys; {statement}; {_REPORT}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize(
    "statement",
    [
        "from lighthouse import LighthouseServer",
        "from lighthouse import ManagerClient",
        "import lighthouse.coordinator.server",
        "import lighthouse.replica.server",
        "import lighthouse.testing",
    ],
)
def test_the_grpc_modules_turn_the_event_engine_off(statement: str) -> None:
    assert _fresh(statement, None) == [repr(ENGINE_EXPERIMENTS), "True"]


@pytest.mark.parametrize("chosen", ["", "event_engine_client"])
def test_a_process_that_chose_keeps_its_choice(chosen: str) -> None:
    assert _fresh("from lighthouse import LighthouseServer", chosen) == [repr(chosen), "True"]


@pytest.mark.parametrize("statement", ["import lighthouse", "import lighthouse.errors"])
def test_importing_the_package_or_its_errors_sets_nothing(statement: str) -> None:
    assert _fresh(statement, None) == ["None", "False"]


def test_only_lighthouse_grpc_imports_grpc_and_it_applies_the_settings_first() -> None:
    importers = sorted(
        {e.importer for e in EDGES if _under(e.importer, "lighthouse") and _under(e.target, "grpc")}
    )
    assert importers == ["lighthouse._grpc"]
    order = [e.target for e in EDGES if e.importer == "lighthouse._grpc"]
    assert order.index("lighthouse._grpc_env") < order.index("grpc")
