"""A server that any machine may reach, with no job secret, says so once at start."""

from __future__ import annotations

import logging

import pytest

from lighthouse import auth

SECRET = "s3cret-for-this-job-only"


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


# 127.0.0.1 as /proc/net/tcp writes it, and as an IPv4-mapped address in /proc/net/tcp6
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}


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
    from torchft_pg.manager_setup import MANAGER_ADDR_KEY

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
