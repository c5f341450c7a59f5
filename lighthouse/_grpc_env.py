"""gRPC's I/O engine for this process: the one measured cheaper per message here.

Every lighthouse call and liveness message pays gRPC's per-message cost on
both ends, and a lease holder exchanges two messages with the lighthouse per
step. With grpcio 1.85, gRPC's newer EventEngine client and listener hand
each message across one thread more than the older engine does: a bidi
stream exchange measured 210-250 us of CPU a side with them and 134-178 us
without (two processes on loopback, uvloop), and the manager-level quorum
benchmark at 16 replica groups went from 13.1-14.8 ms to 11.6-12.1 ms per
step. So, unless the process already chose (``GRPC_EXPERIMENTS`` set, even to
""), this turns both off before gRPC starts.

It must run before anything imports ``grpc`` (gRPC reads the variable once).
No lighthouse module imports ``grpc`` itself: each that uses gRPC writes
``from lighthouse._grpc import grpc``, and ``lighthouse/_grpc.py`` imports this
module first (tests/unit/test_lh_grpc_env.py checks both). ``import lighthouse``
alone sets nothing (its ``__init__`` is lazy), nor does ``lighthouse.errors``,
which torchft_pg's process groups import: the variable is set when the first
module that uses gRPC is imported, e.g. on first use of ``LighthouseServer``,
``ManagerClient`` or the Manager. A process that imported ``grpc`` earlier
keeps gRPC's defaults, which work the same, only at a higher cost. Child
processes inherit the variable.
"""

from __future__ import annotations

import os

ENGINE_EXPERIMENTS = "-event_engine_client,-event_engine_listener"

os.environ.setdefault("GRPC_EXPERIMENTS", ENGINE_EXPERIMENTS)
