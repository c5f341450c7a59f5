"""The per-replica-group side: a manager server per group and its ranks' clients.

    server.py        ``ManagerServer`` (group rank 0): its gRPC service and lifecycle
    group_rounds.py  ``GroupRounds``: the group's ranks gathered into one lighthouse call
                     per round, and their commit votes into one decision
    link.py          the server's link to the lighthouse (liveness, quorum stream)
    lease_holder.py  the server's side of a quorum lease
    ranks.py         from a quorum to one group rank's ``QuorumResult`` (pure)
    interface.py     ``ManagerClientProtocol``: what a rank needs of its server
    client.py        ``ManagerClient``: the gRPC client (every rank)
    local.py         ``LocalManagerClient``: the in-process client (group rank 0)

Imports only the shared top-level modules of ``lighthouse``, never
``lighthouse.coordinator`` (tests/unit/test_import_directions.py).
"""
