"""Store address parsing: the forms we accept and clear errors for the rest."""

from __future__ import annotations

from datetime import timedelta

import pytest

from torchft_pg.store import StoreAddress, create_store_client, parse_store_address


@pytest.mark.parametrize(
    ("addr", "want"),
    [
        ("127.0.0.1:29500/torchft/e1/3/0", StoreAddress("127.0.0.1", 29500, "torchft/e1/3/0")),
        ("localhost:1/p", StoreAddress("localhost", 1, "p")),
        ("[::1]:29500/p", StoreAddress("::1", 29500, "p")),
        ("[fdaa::6]:29521/torchft/0/1", StoreAddress("fdaa::6", 29521, "torchft/0/1")),
        ("host:80", StoreAddress("host", 80, "")),
    ],
)
def test_parses_host_port_prefix_including_ipv6(addr: str, want: StoreAddress) -> None:
    assert parse_store_address(addr) == want


def test_round_trips_through_str() -> None:
    for addr in ("127.0.0.1:29500/a/b", "[::1]:7/p"):
        assert str(parse_store_address(addr)) == addr


@pytest.mark.parametrize(
    "addr", ["", "nohost", "host:/p", ":29500/p", "::1:29500/p", "host:port/p", "host:70000/p"]
)
def test_malformed_address_error_names_the_value(addr: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_store_address(addr)
    assert repr(addr) in str(err.value) or "port" in str(err.value)


def test_non_string_address_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="host:port/prefix"):
        parse_store_address(29500)  # type: ignore[arg-type]


def test_create_store_client_rejects_bad_timeout_before_connecting() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        create_store_client("127.0.0.1:1/p", timedelta(0))
