"""The open-file limit: raised at a server's start, and connection caps checked against it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from lighthouse import LighthouseServer, ManagerServer
from lighthouse.fd_limit import connections_that_fit, resolve_max_connections
from tests.integration.lh_fixtures import ROOT


def resolve(requested: int | None, limit: int) -> int:
    return resolve_max_connections(
        requested, default=4096, floor=8, reserve=128, limit=limit, what="the test server"
    )


def test_the_default_cap_shrinks_to_what_the_limit_carries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert connections_that_fit(1024, 128) == 896 and connections_that_fit(100, 128) == 0
    assert resolve(None, 1 << 20) == 4096
    assert caplog.records == []
    assert resolve(None, 1024) == 896
    assert "max_connections 896 (the limit carries no more than that" in caplog.text
    with pytest.raises(ValueError, match=r"needs at least 8 connections, but RLIMIT_NOFILE is 130"):
        resolve(None, 130)


def test_an_explicit_cap_the_limit_cannot_carry_is_refused_naming_the_figures() -> None:
    assert resolve(896, 1024) == 896
    with pytest.raises(ValueError) as info:
        resolve(897, 1024)
    message = str(info.value)
    assert "max_connections=897 does not fit: RLIMIT_NOFILE is 1024" in message, message
    assert "128 descriptors stay in reserve" in message and "at most 896" in message
    with pytest.raises(ValueError, match="max_connections must be >= 8, got 4"):
        resolve(4, 1 << 20)
    with pytest.raises(TypeError, match="max_connections must be an int or None, got '64'"):
        resolve("64", 1 << 20)  # type: ignore[arg-type]


_CHILD = """
import json, logging, resource
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from lighthouse.fd_limit import raise_nofile_limit
first = raise_nofile_limit()
print(json.dumps([first, raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


@pytest.mark.parametrize("soft_hard", [(512, 2048), (1024, 1024)])
def test_the_soft_limit_is_raised_to_the_hard_one_once_and_logged(
    soft_hard: tuple[int, int],
) -> None:
    soft, hard = soft_hard
    _, our_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if our_hard != resource.RLIM_INFINITY and our_hard < hard:
        pytest.skip(f"this process's hard RLIMIT_NOFILE {our_hard} is below {hard}")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, soft_hard),
    )
    first, again, now = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == again == now == [hard, hard]
    logged = [line for line in proc.stderr.splitlines() if "RLIMIT_NOFILE" in line]
    raised = f", raised from {soft}" if soft != hard else ""
    level = "INFO" if hard > 1024 else "WARNING"  # 1024 is the usual soft limit: worth a warning
    assert logged == [f"{level} open-file limit (RLIMIT_NOFILE): {hard}{raised} (hard {hard})"]


def test_servers_refuse_caps_that_cannot_hold_their_replicas_before_binding() -> None:
    with pytest.raises(ValueError, match=r"max_connections must be >= 16, got 8"):
        LighthouseServer(bind="127.0.0.1:0", min_replicas=8, max_connections=8)
    with pytest.raises(ValueError, match=r"manager server of 'r:1'.*must be >= 16, got 8"):
        ManagerServer("r:1", "127.0.0.1:1", bind="127.0.0.1:0", world_size=8, max_connections=8)


def test_the_command_line_refuses_a_cap_the_limit_cannot_carry() -> None:
    _, our_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if our_hard != resource.RLIM_INFINITY and our_hard < 1024:
        pytest.skip(f"this process's hard RLIMIT_NOFILE {our_hard} is below 1024")
    limited = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    args = ["-m", "lighthouse", "--bind", "127.0.0.1:0", "--max-connections", "5000"]
    proc = subprocess.run(
        [sys.executable, "-c", limited, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "max_connections=5000 does not fit: RLIMIT_NOFILE is 1024" in proc.stderr, proc.stderr
