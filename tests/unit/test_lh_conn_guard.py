"""gRPC's peer text, read as the address and port a socket reports (no sockets)."""

from __future__ import annotations

from lighthouse._conn_guard import parse_peer


def test_peers_in_every_form_grpc_writes_them() -> None:
    assert parse_peer("ipv4:10.0.0.5:41234") == ("10.0.0.5", 41234)
    assert parse_peer("ipv6:%5B::1%5D:5000") == ("::1", 5000)
    assert parse_peer("ipv6:[2001:db8::1]:5000") == ("2001:db8::1", 5000)
    # an IPv4 client of a dual-stack listener, as its socket reports it
    assert parse_peer("ipv6:[::ffff:10.0.0.5]:7") == ("10.0.0.5", 7)
    assert parse_peer("ipv6:%5Bfe80::1%25eth0%5D:7") == ("fe80::1", 7)
    assert parse_peer("unix:/tmp/socket") is None
    assert parse_peer("ipv4:10.0.0.5") is None
