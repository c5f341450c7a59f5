"""Store address parsing: the forms we accept and clear errors for the rest."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from torchft_pg.process_group.base import parse_configure_args
from torchft_pg.store import StoreAddress, create_store_client, parse_store_address

T = timedelta(seconds=10)


@pytest.mark.parametrize(
    ("addr", "want"),
    [
        (
            "127.0.0.1:29500/torchft/e1/3/0",
            StoreAddress(host="127.0.0.1", port=29500, prefix="torchft/e1/3/0"),
        ),
        ("localhost:1/p", StoreAddress(host="localhost", port=1, prefix="p")),
        ("[::1]:29500/p", StoreAddress(host="::1", port=29500, prefix="p")),
        (
            "[fdaa::6]:29521/torchft/0/1",
            StoreAddress(host="fdaa::6", port=29521, prefix="torchft/0/1"),
        ),
        ("host:80", StoreAddress(host="host", port=80, prefix="")),
        # unbracketed IPv6, as torchft writes them: the field after the last colon is the port
        ("::1:1234/prefix", StoreAddress(host="::1", port=1234, prefix="prefix")),
        ("::1:29521/torchft/0/1", StoreAddress(host="::1", port=29521, prefix="torchft/0/1")),
        (
            "fdaa:0:1:2:3:4:5:6:29521/torchft/0/1",
            StoreAddress(host="fdaa:0:1:2:3:4:5:6", port=29521, prefix="torchft/0/1"),
        ),
        (
            "[fdaa:0:1:2:3:4:5:6]:29521/torchft/0/1",
            StoreAddress(host="fdaa:0:1:2:3:4:5:6", port=29521, prefix="torchft/0/1"),
        ),
        ("fe80::1%eth0:7/p", StoreAddress(host="fe80::1%eth0", port=7, prefix="p")),
        ("[fe80::1%eth0]:7/p", StoreAddress(host="fe80::1%eth0", port=7, prefix="p")),
        ("::ffff:10.0.0.1:80/p", StoreAddress(host="::ffff:10.0.0.1", port=80, prefix="p")),
    ],
)
def test_parses_host_port_prefix_including_ipv6(addr: str, want: StoreAddress) -> None:
    assert parse_store_address(addr) == want
    assert StoreAddress.parse(addr) == want


def test_round_trips_through_str() -> None:
    for addr in ("127.0.0.1:29500/a/b", "[::1]:7/p"):
        assert str(parse_store_address(addr)) == addr
    assert str(parse_store_address("::1:7/p")) == "[::1]:7/p", "written bracketed"


def test_is_frozen_and_keyword_only() -> None:
    addr = StoreAddress(host="h", port=1, prefix="p")
    with pytest.raises(dataclasses.FrozenInstanceError):
        addr.port = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        StoreAddress("h", 1, "p")  # type: ignore[misc]


def test_a_parsed_address_passes_through() -> None:
    addr = StoreAddress(host="h", port=1, prefix="p")
    assert parse_store_address(addr) is addr


@pytest.mark.parametrize(
    "addr",
    [
        "",
        "nohost",
        "host:/p",
        ":29500/p",
        "host:port/p",
        "host:70000/p",
        # a host with colons must be an IPv6 literal
        "a:b:29500/p",
        "host:1:29500/p",
        "::1::29500/p",
        "::1:/p",
        # brackets must enclose an IPv6 literal, whole, before the port
        "[::1]29500/p",
        "[::1:29500/p",
        "::1]:29500/p",
        "[host]:29500/p",
        "[127.0.0.1]:29500/p",
        "[]:29500/p",
        "[::1]:29500:1/p",
        "host:+80/p",
        "host: 80/p",
        "host:٣/p",
    ],
)
def test_malformed_address_error_names_the_value(addr: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_store_address(addr)
    assert repr(addr) in str(err.value)
    assert "host:port/prefix" in str(err.value) or "port must be in" in str(err.value)


def test_non_string_address_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="host:port/prefix"):
        parse_store_address(29500)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"host": "", "port": 1}, ValueError, "store host must be"),
        ({"host": "a/b", "port": 1}, ValueError, "'a/b'"),
        ({"host": "h", "port": "1"}, TypeError, "store port must be an int, got '1'"),
        ({"host": "h", "port": True}, TypeError, "got True"),
        ({"host": "h", "port": 0}, ValueError, r"\[1, 65535\], got 0"),
        ({"host": "h", "port": 1, "prefix": 3}, TypeError, "store prefix must be a str, got 3"),
    ],
)
def test_constructing_a_bad_address_names_the_field_and_value(
    fields: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        StoreAddress(**fields)  # type: ignore[arg-type]


def test_configure_arguments_carry_the_parsed_address() -> None:
    call = parse_configure_args(("[::1]:29500/torchft/3/0", 1, 2), {})
    assert call.address == StoreAddress(host="::1", port=29500, prefix="torchft/3/0")
    unchecked = parse_configure_args(("anything", 0, 1), {}, check_address=False)
    assert unchecked.address is None


def test_create_store_client_rejects_bad_timeout_before_connecting() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        create_store_client("127.0.0.1:1/p", timedelta(0))


def test_an_unbracketed_ipv6_address_reaches_its_store() -> None:
    try:
        server = TCPStore("::1", 0, is_master=True, wait_for_workers=False, timeout=T)
    except RuntimeError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    client = create_store_client(f"::1:{server.port}/pre/fix", T)
    client.set("k", "v")
    assert server.get("pre/fix/k") == b"v"
