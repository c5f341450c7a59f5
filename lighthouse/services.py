"""The gRPC method table of both services: every RPC's path, message types and shape.

Servers register their handlers from this table and clients build their
stubs from it (``lighthouse._net``), so a method name, a message type or a
streaming shape is written down once. A test compares the table with the
service definitions in ``proto/lighthouse.proto``. Plain strings only: the
generated protobuf modules are imported by ``lighthouse.wire`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LIGHTHOUSE_HEARTBEAT",
    "LIGHTHOUSE_LIVENESS",
    "LIGHTHOUSE_METHODS",
    "LIGHTHOUSE_QUORUM",
    "LIGHTHOUSE_QUORUM_STREAM",
    "LIGHTHOUSE_SERVICE",
    "MANAGER_CHECKPOINT_METADATA",
    "MANAGER_KILL",
    "MANAGER_METHODS",
    "MANAGER_QUORUM",
    "MANAGER_SERVICE",
    "MANAGER_SHOULD_COMMIT",
    "MANAGER_WATCH_FAILURES",
    "SERVICES",
    "Method",
    "Shape",
]

LIGHTHOUSE_SERVICE = "torchft_pg.LighthouseService"
MANAGER_SERVICE = "torchft_pg.ManagerService"

#: gRPC's names for the four call shapes (request side, then response side).
Shape = Literal["unary_unary", "unary_stream", "stream_unary", "stream_stream"]


@dataclass(frozen=True, kw_only=True)
class Method:
    """One RPC: ``service`` and ``name`` (its path is ``/service/name``), the full
    protobuf names of its ``request`` and ``response`` messages, and whether each
    side is a stream."""

    service: str
    name: str
    request: str
    response: str
    client_streaming: bool = False
    server_streaming: bool = False

    @property
    def path(self) -> str:
        """The gRPC method path, ``/package.Service/Method``."""
        return f"/{self.service}/{self.name}"

    @property
    def shape(self) -> Shape:
        """``unary_unary``, ``unary_stream``, ``stream_unary`` or ``stream_stream``."""
        request = "stream" if self.client_streaming else "unary"
        response = "stream" if self.server_streaming else "unary"
        return f"{request}_{response}"  # type: ignore[return-value]


def _lighthouse(name: str, request: str, response: str, streaming: bool = False) -> Method:
    return Method(
        service=LIGHTHOUSE_SERVICE,
        name=name,
        request=f"torchft_pg.{request}",
        response=f"torchft_pg.{response}",
        client_streaming=streaming,
        server_streaming=streaming,
    )


def _manager(name: str, request: str, response: str, server_streaming: bool = False) -> Method:
    return Method(
        service=MANAGER_SERVICE,
        name=name,
        request=f"torchft_pg.{request}",
        response=f"torchft_pg.{response}",
        server_streaming=server_streaming,
    )


LIGHTHOUSE_QUORUM = _lighthouse("Quorum", "LighthouseQuorumRequest", "LighthouseQuorumResponse")
LIGHTHOUSE_QUORUM_STREAM = _lighthouse(
    "QuorumStream", "LighthouseQuorumRequest", "LighthouseQuorumResponse", streaming=True
)
LIGHTHOUSE_HEARTBEAT = _lighthouse(
    "Heartbeat", "LighthouseHeartbeatRequest", "LighthouseHeartbeatResponse"
)
LIGHTHOUSE_LIVENESS = _lighthouse("Liveness", "LivenessPing", "LivenessEvent", streaming=True)

MANAGER_QUORUM = _manager("Quorum", "ManagerQuorumRequest", "ManagerQuorumResponse")
MANAGER_CHECKPOINT_METADATA = _manager(
    "CheckpointMetadata", "CheckpointMetadataRequest", "CheckpointMetadataResponse"
)
MANAGER_SHOULD_COMMIT = _manager("ShouldCommit", "ShouldCommitRequest", "ShouldCommitResponse")
MANAGER_KILL = _manager("Kill", "KillRequest", "KillResponse")
MANAGER_WATCH_FAILURES = _manager(
    "WatchFailures", "WatchFailuresRequest", "FailureNotice", server_streaming=True
)

LIGHTHOUSE_METHODS = (
    LIGHTHOUSE_QUORUM,
    LIGHTHOUSE_QUORUM_STREAM,
    LIGHTHOUSE_HEARTBEAT,
    LIGHTHOUSE_LIVENESS,
)
MANAGER_METHODS = (
    MANAGER_QUORUM,
    MANAGER_CHECKPOINT_METADATA,
    MANAGER_SHOULD_COMMIT,
    MANAGER_KILL,
    MANAGER_WATCH_FAILURES,
)
#: Every service by its full name, with its methods.
SERVICES: dict[str, tuple[Method, ...]] = {
    LIGHTHOUSE_SERVICE: LIGHTHOUSE_METHODS,
    MANAGER_SERVICE: MANAGER_METHODS,
}
