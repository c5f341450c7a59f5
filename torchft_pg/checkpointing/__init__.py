"""Checkpoint transports for live healing: move a state dict between replicas.

`HTTPTransport` (pull over HTTP, chunked and parallel) and `PGTransport` (push
over an already configured process group) share one wire format
(`serialization`): a validated JSON skeleton (`skeleton`; nothing from a peer is
ever unpickled) plus raw tensor bytes with per-piece checksums (`layout`).
`InProcessTransport` is the socket-free fake for unit tests (same wire format).

State dicts may hold DTensors: each travels as its local shard, and comes back
as the receiver's own DTensor (filled in place) when the receiver's
`state_dict` callable has one at that path, else as the plain local shard
(details in `serialization`). `address()` is what `metadata()` advertises;
`allow_checkpoint(step)` serves the state dict last sent for `step` again.
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
