"""The job's lighthouse: one per job, it decides every quorum and detects dead replicas.

    quorum.py   the quorum rules (pure): who is in the next quorum, and when
    lease.py    the lighthouse's record of the outstanding quorum lease (pure)
    core.py     pending long-polls, liveness streams and ticks, on one event loop
    server.py   ``LighthouseServer``: the gRPC service around the core
    status.py   the dashboard, ``/status`` JSON and ``/metrics``
    client.py   ``LighthouseClient``: a blocking client for bare quorum users
    cli.py      ``python -m lighthouse``

Imports only the shared top-level modules of ``lighthouse``, never
``lighthouse.replica`` (tests/unit/test_import_directions.py).
"""
