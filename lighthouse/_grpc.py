"""``grpc`` for the lighthouse's modules, imported after gRPC's engine settings.

gRPC reads its engine settings once, when it is first imported, so every
lighthouse module that uses gRPC writes ``from lighthouse._grpc import grpc``,
never ``import grpc``: this module applies ``lighthouse._grpc_env`` first
(tests/unit/test_lh_grpc_env.py checks that no other lighthouse module imports
``grpc``). ``grpc`` here is the ``grpc`` module itself.
"""

from __future__ import annotations

from lighthouse import _grpc_env  # noqa: F401  (before grpc: it sets GRPC_EXPERIMENTS)

# isort: split
import grpc

__all__ = ["grpc"]
