"""Session-wide settings every test and every process it starts inherits."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_STATE_HOME = "XDG_STATE_HOME"


def pytest_configure(config: pytest.Config) -> None:
    """A lighthouse started with ``--state-file auto`` keeps its state under
    ``$XDG_STATE_HOME``: the tests' lighthouses keep theirs in a folder of this
    session, never in the user's home (removed at the end)."""
    if not hasattr(config, "workerinput"):
        config._torchft_pg_state_home = tempfile.mkdtemp(prefix="torchft-pg-tests-state-")  # type: ignore[attr-defined]
        os.environ[_STATE_HOME] = config._torchft_pg_state_home  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "_torchft_pg_state_home", None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
