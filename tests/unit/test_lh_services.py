"""The gRPC method table (``lighthouse.services``) matches ``proto/lighthouse.proto``,
and servers and clients can only use it as the proto declares."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from lighthouse import _net, services
from lighthouse._gen import lighthouse_pb2 as pb


def _declared() -> dict[str, dict[str, tuple[str, str, bool, bool]]]:
    """Per service, per method: (request, response, client streaming, server streaming),
    read from the descriptor generated from the proto."""
    return {
        name: {
            m.name: (
                m.input_type.full_name,
                m.output_type.full_name,
                m.client_streaming,
                m.server_streaming,
            )
            for m in service.methods
        }
        for name, service in pb.DESCRIPTOR.services_by_name.items()
    }


def _tabled() -> dict[str, dict[str, tuple[str, str, bool, bool]]]:
    return {
        service.rpartition(".")[2]: {
            m.name: (m.request, m.response, m.client_streaming, m.server_streaming) for m in methods
        }
        for service, methods in services.SERVICES.items()
    }


def test_the_method_table_matches_the_proto_service_definitions() -> None:
    assert _tabled() == _declared()
    for full_name, methods in services.SERVICES.items():
        assert pb.DESCRIPTOR.services_by_name[full_name.rpartition(".")[2]].full_name == full_name
        for m in methods:
            assert m.service == full_name
            assert m.path == f"/{full_name}/{m.name}"


def test_the_named_methods_are_the_tabled_ones() -> None:
    named = {
        getattr(services, n)
        for n in services.__all__
        if isinstance(getattr(services, n), services.Method)
    }
    assert named == {m for methods in services.SERVICES.values() for m in methods}


@pytest.mark.parametrize(
    ("method", "shape"),
    [
        (services.LIGHTHOUSE_QUORUM, "unary_unary"),
        (services.LIGHTHOUSE_QUORUM_STREAM, "stream_stream"),
        (services.LIGHTHOUSE_LIVENESS, "stream_stream"),
        (services.MANAGER_WATCH_FAILURES, "unary_stream"),
        (services.MANAGER_SHOULD_COMMIT, "unary_unary"),
    ],
)
def test_stubs_are_built_with_the_declared_shape(method: services.Method, shape: str) -> None:
    class Channel:
        def __getattr__(self, name: str) -> Any:
            return lambda path: (name, path)

    assert _net.stub(Channel(), method) == (shape, method.path)


def _handler(request: bytes, context: Any) -> bytes:
    return b""


def test_a_server_must_register_exactly_the_declared_methods() -> None:
    names = [m.name for m in services.MANAGER_METHODS]
    complete = {n: _handler for n in names}
    assert isinstance(
        _net.method_handlers(services.MANAGER_SERVICE, complete), grpc.GenericRpcHandler
    )
    with pytest.raises(ValueError, match="must be exactly"):
        _net.method_handlers(services.MANAGER_SERVICE, {n: _handler for n in names[1:]})
    with pytest.raises(ValueError, match="must be exactly"):
        _net.method_handlers(services.MANAGER_SERVICE, {**complete, "Nope": _handler})


def test_servers_and_clients_use_methods_only_through_the_table() -> None:
    """Outside ``lighthouse._net``, no module builds a stub or a handler by hand,
    so none can use a method with a name or shape the proto does not declare."""
    root = Path(__file__).resolve().parents[2] / "lighthouse"
    by_hand = re.compile(
        r"\.(unary_unary|unary_stream|stream_unary|stream_stream)\(|_rpc_method_handler"
    )
    offenders = [
        str(path.relative_to(root))
        for path in sorted(root.rglob("*.py"))
        if "_gen" not in path.parts and path.name != "_net.py" and by_hand.search(path.read_text())
    ]
    assert offenders == []
