"""A new user's wiring mistakes fail within seconds, naming what is wrong.

Each used to be a raw error after a minute: a store that is not there (65 s,
a c10d DistNetworkError per retry), a lighthouse host that does not resolve
(retried for 51-60 s), a second lighthouse on a port in use (a gRPC
traceback).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore

from lighthouse import LighthouseServer, LighthouseUnavailableError
from torchft_pg import ProcessGroupGloo
from torchft_pg.manager import Manager

FAST_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def manager(**kwargs: Any) -> Iterator[Manager]:
    m = Manager(
        ProcessGroupGloo(timeout=5),
        min_replica_size=1,
        rank=0,
        world_size=1,
        replica_id="x",
        **kwargs,
    )
    try:
        yield m
    finally:
        m.shutdown(wait=False)


def first_step_error(**kwargs: Any) -> tuple[Exception, float]:
    start = time.monotonic()
    with manager(**kwargs) as m, pytest.raises(Exception) as exc:
        m.start_quorum()
    return exc.value, time.monotonic() - start


def test_no_store_at_master_port_is_named_within_seconds() -> None:
    port = free_port()
    error, took = first_step_error(
        store_addr="127.0.0.1", store_port=port, lighthouse_addr="127.0.0.1:1"
    )
    assert isinstance(error, ConnectionError), error
    assert f"127.0.0.1:{port}" in str(error) and "MASTER_ADDR:MASTER_PORT" in str(error)
    assert took < FAST_S


def test_a_store_host_that_does_not_resolve_fails_at_once() -> None:
    error, took = first_step_error(
        store_addr="no-such-host.invalid", store_port=29500, lighthouse_addr="127.0.0.1:1"
    )
    assert isinstance(error, ConnectionError) and "does not resolve" in str(error), error
    assert took < FAST_S


def test_a_lighthouse_host_that_does_not_resolve_fails_at_once() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    error, took = first_step_error(
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr="http://no-such-host.invalid:29510",
    )
    assert isinstance(error, LighthouseUnavailableError), error
    assert "'no-such-host.invalid'" in str(error) and "TORCHFT_LIGHTHOUSE" in str(error)
    assert took < FAST_S


def test_a_second_lighthouse_on_a_port_in_use_says_so() -> None:
    first = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, http_bind=None)
    try:
        port = first.address().rsplit(":", 1)[1]
        with pytest.raises(
            OSError, match=f"cannot listen on '127.0.0.1:{port}': port {port} is in use"
        ):
            LighthouseServer(bind=f"127.0.0.1:{port}", min_replicas=1, http_bind=None)
        cli = Path(sys.executable).parent / "torchft-pg-lighthouse"
        out = subprocess.run(
            [
                str(cli),
                "--bind",
                f"127.0.0.1:{port}",
                "--http-bind",
                "none",
                "--state-file",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, out
        assert f"port {port} is in use" in out.stderr and "Traceback" not in out.stderr
    finally:
        first.shutdown()
