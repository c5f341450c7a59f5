"""Importing the lighthouse picks gRPC's cheaper I/O engine, unless the process chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lighthouse._grpc_env import ENGINE_EXPERIMENTS

_PROBE = (
    "import os, sys; import lighthouse; "
    "print(repr(os.environ.get('GRPC_EXPERIMENTS'))); print('grpc' in sys.modules)"
)


def _fresh(env_value: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if env_value is not None:
        env["GRPC_EXPERIMENTS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_importing_the_lighthouse_turns_the_event_engine_off() -> None:
    assert _fresh(None) == [repr(ENGINE_EXPERIMENTS), "True"]


@pytest.mark.parametrize("chosen", ["", "event_engine_client"])
def test_a_process_that_chose_keeps_its_choice(chosen: str) -> None:
    assert _fresh(chosen) == [repr(chosen), "True"]
