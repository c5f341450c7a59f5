"""Checkpoint transports for live healing: move a state dict between replicas.

`HTTPTransport` (pull over HTTP, chunked and parallel) and `PGTransport` (push
over an already configured process group) share one wire format
(`serialization`): a validated JSON skeleton (`skeleton`; nothing from a peer is
ever unpickled) plus raw tensor bytes with per-piece checksums (`layout`).
`InProcessTransport` is the socket-free fake for unit tests (same wire format).

State dicts may hold DTensors: each travels as its local shard plus a
description of its layout, and comes back as the receiver's own DTensor
(filled in place) when the receiver's `state_dict` callable has one at that
path, else as a DTensor rebuilt with the sender's mesh and placements on this
process's groups of the same names (details in `serialization` and
`dtensor_layout`). `address()` is what `metadata()` advertises;
`allow_checkpoint(step)` serves the state dict last sent for `step` again.
`HTTPTransport`'s receive errors are also the urllib errors torchft's raises
(`CheckpointHTTPError`, `CheckpointTimeoutError`).
"""

from torchft_pg.checkpointing.http_fetch import CheckpointHTTPError, CheckpointTimeoutError
from torchft_pg.checkpointing.http_transport import HTTPTransport
from torchft_pg.checkpointing.local import InProcessHub, InProcessTransport
from torchft_pg.checkpointing.pg_transport import PGTransport
from torchft_pg.checkpointing.transport import CheckpointTransport

__all__ = [
    "CheckpointHTTPError",
    "CheckpointTimeoutError",
    "CheckpointTransport",
    "HTTPTransport",
    "InProcessHub",
    "InProcessTransport",
    "PGTransport",
]
