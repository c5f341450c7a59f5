"""Closed unless opened: with no job secret every server of the job listens on
loopback only, refuses a bind beyond it unless the user opts out, and says so once
when they do (``lighthouse.exposure``, ``auth.warn_if_exposed``)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from lighthouse import LighthouseServer, ManagerServer, auth, exposure
from tests.integration.lh_fixtures import ROOT

SECRET = "s3cret-for-this-job-only"
_ENV = (auth.SECRET_ENV, auth.SECRET_FILE_ENV, exposure.INSECURE_ENV)


@pytest.fixture
def no_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No job secret and no opt-out in this process's environment."""
    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    yield


def _assert_names_every_way_out(message: str, what: str, bind: str) -> None:
    assert what in message and bind in message, message
    for needed in (auth.SECRET_ENV, auth.SECRET_FILE_ENV, "TORCHFT_INSECURE=1", "--insecure"):
        assert needed in message, (needed, message)


@pytest.mark.parametrize("bind", ["[::]:0", "0.0.0.0:0", "198.18.0.4:0", "trainer-7:0"])
def test_a_bind_beyond_loopback_without_a_secret_is_refused_naming_the_way_out(
    bind: str,
) -> None:
    host = bind.rsplit(":", 1)[0].strip("[]")
    with pytest.raises(ValueError) as info:
        exposure.check_bind("the lighthouse", bind, host, None, insecure=False)
    _assert_names_every_way_out(str(info.value), "the lighthouse", bind)
    exposure.check_bind("the lighthouse", bind, host, SECRET, insecure=False)  # a secret opens
    exposure.check_bind("the lighthouse", bind, host, None, insecure=True)  # so does opting out


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"])
def test_loopback_binds_never_need_a_secret(host: str) -> None:
    exposure.check_bind("the manager server", f"{host}:0", host, None, insecure=False)
    assert exposure.is_loopback(host)


def test_the_default_host_is_every_interface_only_with_a_secret_or_an_opt_out() -> None:
    assert exposure.default_host(None, False) == "127.0.0.1"
    assert exposure.default_host(SECRET, False) == "::"
    assert exposure.default_host(None, True) == "::"
    assert exposure.default_host(None, False, loopback="127.0.0.1", wildcard="0.0.0.0") == (
        "127.0.0.1"
    )


@pytest.mark.parametrize(
    ("value", "opted_out"), [("1", True), ("true", True), ("YES", True), ("", False), ("0", False)]
)
def test_the_opt_out_variable(value: str, opted_out: bool) -> None:
    assert exposure.insecure_opted_out(env={exposure.INSECURE_ENV: value}) is opted_out
    assert exposure.insecure_opted_out(False, env={exposure.INSECURE_ENV: "1"}) is False


def test_an_unclear_opt_out_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"TORCHFT_INSECURE must be one of .* got 'maybe'"):
        exposure.insecure_opted_out(env={exposure.INSECURE_ENV: "maybe"})


def test_a_loopback_server_never_advertises_another_host() -> None:
    exposure.check_advertised("the manager server", "localhost", "127.0.0.1")
    exposure.check_advertised("the manager server", "::", "trainer-7")  # every interface
    with pytest.raises(ValueError) as info:
        exposure.check_advertised("the manager server", "127.0.0.1", "trainer-7")
    message = str(info.value)
    assert "the manager server" in message and "'trainer-7'" in message
    assert auth.SECRET_ENV in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "[::1]", "::1", "localhost"])
def test_loopback_binds_are_not_exposed(host: str) -> None:
    assert auth.exposure_warning("the lighthouse", host, None) is None


@pytest.mark.parametrize("host", ["[::]", "::", "0.0.0.0", "", "198.18.0.4", "trainer-7"])
def test_other_binds_without_a_secret_are_named_with_the_fix(host: str) -> None:
    warning = auth.exposure_warning("the lighthouse", host, None)
    assert warning is not None
    assert "the lighthouse listens on" in warning and "no job secret" in warning
    assert auth.SECRET_ENV in warning and "127.0.0.1" in warning
    assert auth.exposure_warning("the lighthouse", host, SECRET) is None


def test_the_warning_is_logged_once_per_kind_of_server(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test-exposure")
    with caplog.at_level(logging.WARNING, logger="test-exposure"):
        for _ in range(3):
            auth.warn_if_exposed(log, "a test server", "[::]", None)
        auth.warn_if_exposed(log, "another test server", "127.0.0.1", None)
        auth.warn_if_exposed(log, "a third test server", "0.0.0.0", SECRET)
    assert [r.getMessage()[:30] for r in caplog.records] == ["a test server listens on [::] "]


# 127.0.0.1 as /proc/net/tcp writes it, as an IPv4-mapped address in /proc/net/tcp6,
# and ::1 there
LOOPBACK = {
    "0100007F",
    "0000000000000000FFFF00000100007F",
    "00000000000000000000000001000000",
}


def _listening_hosts(port: int) -> set[str]:
    """The local addresses (hex, as in /proc/net/tcp*) sockets listen on at `port`."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                host, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    hosts.add(host)
    return hosts


def test_bind_host_keeps_a_managers_servers_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCHFT_BIND_HOST=127.0.0.1: the manager server and the checkpoint server
    listen on loopback only."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from lighthouse import LighthouseServer
    from torchft_pg import Manager, ProcessGroupGloo
    from torchft_pg.manager.group_server import MANAGER_ADDR_KEY

    monkeypatch.setenv("TORCHFT_BIND_HOST", "127.0.0.1")
    with LighthouseServer(bind="127.0.0.1:0", min_replicas=1) as lh:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            ProcessGroupGloo(timedelta(seconds=10)),
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lh.address(),
            replica_id="local",
            connect_timeout=timedelta(seconds=10),
        )
        try:
            manager.start_quorum()
            manager.wait_quorum()
            manager_port = int(store.get(MANAGER_ADDR_KEY).decode().rsplit(":", 1)[1])
            checkpoint_port = int(manager._healer.transport.metadata().rsplit(":", 1)[1][:-12])
            for port in (manager_port, checkpoint_port):
                hosts = _listening_hosts(port)
                assert hosts and hosts <= LOOPBACK, (port, hosts)
        finally:
            manager.shutdown()


def test_servers_without_a_secret_listen_on_loopback_by_default(no_secret: None) -> None:
    """The lighthouse (gRPC and status page), a manager server and a checkpoint
    server started with no bind and no secret: loopback only, advertised as such."""
    from torchft_pg.checkpointing import HTTPTransport

    with LighthouseServer(min_replicas=1, http_bind="localhost:0") as lh:
        assert lh.address().startswith("http://127.0.0.1:")
        for port in (lh.port, int(str(lh.http_address()).rsplit(":", 1)[1])):
            hosts = _listening_hosts(port)
            assert hosts and hosts <= LOOPBACK, (port, hosts)
        ms = ManagerServer("a:1", lh.address(), connect_timeout=timedelta(seconds=10))
        try:
            host, ms_port = ms.address().rsplit(":", 1)
            assert host == "127.0.0.1", ms.address()
            hosts = _listening_hosts(int(ms_port))
            assert hosts and hosts <= LOOPBACK, hosts
        finally:
            ms.shutdown()
    transport: HTTPTransport[dict[str, int]] = HTTPTransport(timedelta(seconds=5))
    try:
        assert transport.metadata().startswith("http://127.0.0.1:")
        hosts = _listening_hosts(transport.port)
        assert hosts and hosts <= LOOPBACK, hosts
    finally:
        transport.shutdown()


def test_every_server_refuses_an_open_bind_without_a_secret(no_secret: None) -> None:
    from torchft_pg.checkpointing import HTTPTransport

    for what, start in (
        ("the lighthouse", lambda: LighthouseServer("[::]:0", 1)),  # Ray Train's bind
        ("status page", lambda: LighthouseServer("127.0.0.1:0", 1, http_bind="[::]:0")),
        ("the manager server", lambda: ManagerServer("a:1", "127.0.0.1:1", bind="0.0.0.0:0")),
        ("the checkpoint HTTP server", lambda: HTTPTransport(5, bind_host="0.0.0.0")),
    ):
        with pytest.raises(ValueError) as info:
            start()
        message = str(info.value)
        assert what in message and auth.SECRET_ENV in message, message


def test_a_secret_opens_every_interface_and_an_opt_out_does_with_a_warning(
    no_secret: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with LighthouseServer(min_replicas=1, job_secret=SECRET) as lh:
        assert not _listening_hosts(lh.port) <= LOOPBACK  # every interface
    monkeypatch.setenv(exposure.INSECURE_ENV, "1")
    auth._warned_exposed.discard("the lighthouse")
    with caplog.at_level(logging.WARNING, logger="lighthouse"), LighthouseServer("[::]:0", 1) as lh:
        assert not _listening_hosts(lh.port) <= LOOPBACK
    said = [r.getMessage() for r in caplog.records if "no job secret" in r.getMessage()]
    assert len(said) == 1 and "the lighthouse listens on ::" in said[0], said


def _run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lighthouse", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_command_line_refuses_an_open_bind_until_told_insecure(tmp_path: Path) -> None:
    env = _clean_env()
    refused = _run_cli(["--bind", "0.0.0.0:0", "--http-bind", "none"], tmp_path, env)
    assert refused.returncode == 2, refused
    _assert_names_every_way_out(refused.stderr, "the lighthouse", "0.0.0.0:0")
    refused = _run_cli(["--bind", "127.0.0.1:0", "--http-bind", "0.0.0.0:0"], tmp_path, env)
    assert refused.returncode == 2 and "status page" in refused.stderr, refused


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::", port))
        except OSError:
            return False
    return True


def test_torchtitans_lighthouse_command_serves_localhost_without_a_setting(
    tmp_path: Path,
) -> None:
    """torchtitan's README command, as is: the default bind without a secret is
    loopback, and a client of http://localhost:29510 gets a quorum from it."""
    from datetime import timedelta as td

    from lighthouse import LighthouseClient

    if not (_port_free(29510) and _port_free(29511)):
        pytest.skip("ports 29510/29511 are in use on this machine: torchft's defaults need them")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from lighthouse.coordinator.cli import torchft_main; "
            "sys.exit(torchft_main())",
            "--min_replicas",
            "1",
            "--quorum_tick_ms",
            "100",
            "--join_timeout_ms",
            "10000",
        ],
        cwd=tmp_path,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("lighthouse listening on http://127.0.0.1:29510"), first
        assert "status http://127.0.0.1:29511" in first, first
        hosts = _listening_hosts(29510)
        assert hosts and hosts <= LOOPBACK, hosts
        client = LighthouseClient("http://localhost:29510", connect_timeout=td(seconds=10))
        try:
            assert client.quorum("titan", td(seconds=10), step=0).replica_ids == ["titan"]
        finally:
            client.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
