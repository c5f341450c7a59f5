"""`ParameterServer` (torchft's interface): sessions over fresh two-rank groups."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
import torch

from torchft_pg import ProcessGroupGloo
from torchft_pg.parameter_server import ParameterServer
from torchft_pg.process_group import ProcessGroup

SECRET = "0123456789abcdef-secret"


class AddServer(ParameterServer):
    """Receives a number from the client, adds 23 and sends it back, `rounds` times."""

    rounds = 1
    entered = threading.Event()
    release = threading.Event()

    @classmethod
    def new_process_group(cls) -> ProcessGroup:
        return ProcessGroupGloo(timeout=timedelta(seconds=20))

    def forward(self, session_id: str, pg: ProcessGroup) -> None:
        for _ in range(self.rounds):
            data = torch.zeros(1)
            pg.broadcast_one(data, root=1).wait()
            data += 23
            pg.broadcast_one(data, root=0).wait()


def round_trip(pg: ProcessGroup, value: float) -> float:
    data = torch.full((1,), value)
    pg.broadcast_one(data, root=1).wait()  # to the server (rank 0) from the client (rank 1)
    pg.broadcast_one(data, root=0).wait()
    return float(data.item())


def test_each_client_gets_a_session_of_its_own() -> None:
    server = AddServer(port=0)
    try:
        assert server.address().startswith("http://127.0.0.1:")
        assert server.address().endswith("/new_session")
        clients = [AddServer.new_session(server.address()) for _ in range(2)]
        assert [round_trip(pg, v) for pg, v in zip(clients, (12.0, 1.0), strict=True)] == [
            35.0,
            24.0,
        ]
        for pg in clients:
            pg.shutdown()
    finally:
        server.shutdown()


def test_a_job_secret_is_required_of_every_session() -> None:
    server = AddServer(port=0, job_secret=SECRET)
    try:
        with pytest.raises(RuntimeError, match="refused a session: 401"):
            AddServer.new_session(server.address(), job_secret="wrong-secret-0123456789")
        pg = AddServer.new_session(server.address(), job_secret=SECRET)
        assert round_trip(pg, 2.0) == 25.0
        pg.shutdown()
    finally:
        server.shutdown()


def test_a_bad_path_is_refused_naming_it() -> None:
    server = AddServer(port=0)
    try:
        url = server.address().replace("/new_session", "/other")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(url, timeout=10)
        assert exc.value.code == 400 and "'/other'" in exc.value.read().decode()
    finally:
        server.shutdown()


class HeldServer(AddServer):
    """Holds each session open until `release` is set."""

    def forward(self, session_id: str, pg: ProcessGroup) -> None:
        self.entered.set()
        assert self.release.wait(30)


def test_sessions_beyond_the_cap_are_refused_until_one_ends() -> None:
    HeldServer.entered.clear()
    HeldServer.release.clear()
    server = HeldServer(port=0, max_sessions=1)
    try:
        first = HeldServer.new_session(server.address())
        assert HeldServer.entered.wait(30)
        with pytest.raises(RuntimeError, match="refused a session: 503"):
            HeldServer.new_session(server.address())
        HeldServer.release.set()
        first.shutdown()
        # the slot comes back once the first session's forward returns
        second = None
        for _ in range(50):  # bounded: the server frees the slot right after forward
            try:
                second = HeldServer.new_session(server.address())
                break
            except RuntimeError:
                HeldServer.entered.wait(0.1)
        assert second is not None
        second.shutdown()
    finally:
        HeldServer.release.set()
        server.shutdown()


def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="max_sessions must be an int >= 1, got 0"):
        AddServer(port=0, max_sessions=0)
    with pytest.raises(ValueError, match="port must be an int in \\[0, 65535\\], got 70000"):
        AddServer(port=70000)
