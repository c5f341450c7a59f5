"""Where a replica group tells the others its rendezvous store is."""

from __future__ import annotations

import pytest

from torchft_pg.manager.group_server import advertised_store_addr


@pytest.mark.parametrize("loopback", ["localhost", "LOCALHOST", "127.0.0.1", "127.0.1.1", "::1"])
def test_a_loopback_store_host_is_advertised_as_the_ranks_hostname(loopback: str) -> None:
    # MASTER_ADDR=localhost (torchrun --standalone) means this machine to our own ranks
    # only; the other replica groups must reach the store at the advertised hostname.
    assert advertised_store_addr(loopback, 29500, "198.18.0.11") == "198.18.0.11:29500"


@pytest.mark.parametrize("hostname", [None, ""])
def test_without_a_hostname_the_store_host_is_kept(hostname: str | None) -> None:
    assert advertised_store_addr("localhost", 29500, hostname) == "localhost:29500"


@pytest.mark.parametrize("host", ["198.18.0.12", "node7.cluster", "10.0.0.1"])
def test_a_routable_store_host_is_kept(host: str) -> None:
    # The store may live on another machine of the group than this rank's.
    assert advertised_store_addr(host, 1234, "198.18.0.11") == f"{host}:1234"
