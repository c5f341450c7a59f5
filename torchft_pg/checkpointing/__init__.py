"""Checkpoint transports for live healing: move a state dict between replicas.

`HTTPTransport` (pull over HTTP, chunked and parallel) and `PGTransport` (push
over an already configured process group) share one wire format
(`serialization`): a validated JSON skeleton (`skeleton`; nothing from a peer is
ever unpickled) plus raw tensor bytes with per-piece checksums (`layout`).
`InProcessTransport` is the socket-free fake for unit tests (same wire format).
"""

from torchft_pg.checkpointing.http_transport import HTTPTransport
from torchft_pg.checkpointing.local import InProcessHub, InProcessTransport
from torchft_pg.checkpointing.pg_transport import PGTransport
from torchft_pg.checkpointing.transport import CheckpointTransport

__all__ = [
    "CheckpointTransport",
    "HTTPTransport",
    "InProcessHub",
    "InProcessTransport",
    "PGTransport",
]
