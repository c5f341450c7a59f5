"""A standby lighthouse takes a job over when the active one is SIGKILLed under load.

Real processes: the active lighthouse and a ``--standby`` one (the CLI) on one
state file, and two replica groups (``lighthouse.testing replica``: a manager
server each, stepping through quorum rounds) given both addresses. The standby
does not listen while the active one holds the state file, so two lighthouses
never hand out quorums to the job at once; once the active one dies, the
standby reads the committed step it wrote and the groups' next quorums come
from it.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.lh_fixtures import Proc, processes, replica_args

pytestmark = pytest.mark.timeout(120)
JOIN_TIMEOUT_MS = 60_000  # never reached: every quorum here has both groups


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _lighthouse_args(bind: str, state: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "lighthouse",
        "--bind",
        bind,
        "--state-file",
        str(state),
        "--min-replicas",
        "2",
        "--join-timeout-ms",
        str(JOIN_TIMEOUT_MS),
        *extra,
    ]


def _quorum_from(proc: Proc, epoch: str, timeout_s: float) -> dict[str, Any]:
    return proc.wait_event(
        lambda ev: ev.get("event") == "quorum" and ev["epoch"] == epoch, timeout_s
    )


def test_a_standby_takes_the_job_over_when_the_active_lighthouse_dies(tmp_path: Path) -> None:
    state = tmp_path / "lighthouse.state.json"
    active_port, standby_port = _free_port(), _free_port()
    with processes(
        _lighthouse_args(f"127.0.0.1:{active_port}", state, "--http-bind", "none"),
    ) as (active,):
        line = active.next_line(60)
        m = re.match(r"lighthouse listening on \S+ \(epoch (\w+)\)", line)
        assert m, line
        epoch1 = m.group(1)
        with processes(
            _lighthouse_args(
                f"127.0.0.1:{standby_port}",
                state,
                "--standby",
                "--http-bind",
                "127.0.0.1:0",
            ),
        ) as (standby,):
            waiting = standby.next_line(60)
            assert waiting.startswith("standby: waiting for the lighthouse that holds"), waiting
            assert f"pid {active.popen.pid}" in waiting
            assert not _listening(standby_port)  # one lighthouse serves the job at a time

            both = f"127.0.0.1:{active_port},127.0.0.1:{standby_port}"
            with processes(*(replica_args(both, f"g{i}") for i in range(2))) as groups:
                for g in groups:  # training under the active lighthouse, well past step 0
                    g.wait_event(
                        lambda ev: (
                            ev.get("event") == "quorum"
                            and ev["epoch"] == epoch1
                            and ev["size"] == 2
                        ),
                        60,
                    )
                    for _ in range(20):
                        _quorum_from(g, epoch1, 30)
                assert not _listening(standby_port)
                written = json.loads(state.read_text())["committed_step"]
                assert written > 0

                active.popen.kill()  # SIGKILL under load: no clean shutdown, no last write
                active.popen.wait(timeout=10)
                assert standby.next_line(30).startswith("standby: taking the job over")
                line = standby.next_line(60)
                m = re.match(r"lighthouse listening on \S+ \(epoch (\w+)\) status (\S+)", line)
                assert m, line
                epoch2, http = m.groups()
                assert epoch2 != epoch1
                for g in groups:  # both groups go on under the standby, together
                    ev = _quorum_from(g, epoch2, 60)
                    while ev["size"] != 2:
                        ev = _quorum_from(g, epoch2, 60)
                status = json.loads(urllib.request.urlopen(http + "/status", timeout=5).read())
                assert status["committed_step"] >= written  # read from the file, kept
