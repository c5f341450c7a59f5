"""What importing the lighthouse package loads, in a fresh interpreter.

``lighthouse/__init__`` is lazy (PEP 562 ``__getattr__``): ``import lighthouse``
and ``import lighthouse.errors`` load no gRPC, so ``torchft_pg.errors``, which
roots its exception tree in ``lighthouse.errors`` and which process groups (a
Baby child process included) import, does not either. Public names still
import as before, on first use.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import lighthouse

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120  # a cold `import torch` can take tens of seconds


def _run(code: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr


def test_importing_the_package_and_its_errors_loads_no_grpc() -> None:
    _run("import lighthouse, lighthouse.errors, sys; assert 'grpc' not in sys.modules")


def test_importing_the_package_loads_no_other_lighthouse_module() -> None:
    _run(
        "import lighthouse, sys; "
        "loaded = sorted(m for m in sys.modules if m.startswith('lighthouse')); "
        "assert loaded == ['lighthouse'], loaded"
    )


def test_importing_torchft_pg_errors_loads_no_grpc() -> None:
    _run(
        "import torchft_pg.errors, sys; "
        "assert 'grpc' not in sys.modules; "
        "assert 'lighthouse.errors' in sys.modules"
    )


def test_public_names_resolve_on_first_use_to_the_defining_modules_own() -> None:
    for name in lighthouse.__all__:
        module = importlib.import_module(lighthouse._LAZY[name])
        assert getattr(lighthouse, name) is getattr(module, name), name
    from lighthouse import LighthouseServer
    from lighthouse.coordinator.server import LighthouseServer as ServerItself

    assert LighthouseServer is ServerItself


def test_all_and_dir_list_the_public_names() -> None:
    assert set(lighthouse._LAZY) == set(lighthouse.__all__)
    assert set(lighthouse.__all__) <= set(dir(lighthouse))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        lighthouse.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        from lighthouse import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401
