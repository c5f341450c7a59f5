"""Real processes: SIGKILL of a replica group, and the CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from datetime import timedelta

import pytest

from lighthouse import LighthouseClient
from tests.integration.lh_fixtures import lighthouse, processes, replica_args

pytestmark = pytest.mark.timeout(90)


def test_sigkill_of_one_group_survivors_get_next_quorum_within_half_a_second() -> None:
    with lighthouse(min_replicas=2) as lh:  # default join/heartbeat timeouts
        args = [replica_args(lh.address(), f"g{i}") for i in range(3)]
        with processes(*args) as procs:
            for p in procs:
                p.wait_event(lambda ev: ev.get("event") == "quorum" and ev["size"] == 3, 60)
            t_kill = time.monotonic()
            os.kill(procs[0].popen.pid, signal.SIGKILL)
            for p in procs[1:]:
                ev = p.wait_event(lambda ev: ev.get("event") == "quorum" and ev["size"] == 2, 30)
                assert ev["t"] - t_kill < 0.5, f"next quorum took {ev['t'] - t_kill:.3f} s"
                # the lighthouse also pushed a failure notice to this survivor's ranks
                p.wait_event(lambda ev: ev.get("notices", 0) >= 1, 10)
            status = lh.status()
            assert status["recent_deaths"][0]["replica_id"] == "g0"
            assert status["recent_deaths"][0]["reason"] == "liveness stream closed"


def test_cli_serves_quorums_and_status_and_stops_on_sigterm() -> None:
    args = [
        "-m",
        "lighthouse",
        "--bind",
        "127.0.0.1:0",
        "--http-bind",
        "127.0.0.1:0",
        "--min-replicas",
        "1",
        "--join-timeout-ms",
        "100",
    ]
    with processes(args) as (proc,):
        line = proc.next_line(30)
        m = re.match(r"lighthouse listening on (\S+) \(epoch (\w+)\) status (\S+)", line)
        assert m, line
        addr, epoch, http = m.groups()
        q = LighthouseClient(addr).quorum("a", timedelta(seconds=10))
        assert q.epoch == epoch
        status = json.loads(urllib.request.urlopen(http + "/status", timeout=5).read())
        assert status["quorum_id"] == 1
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=20) == 0


def test_cli_rejects_bad_flags() -> None:
    with processes(["-m", "lighthouse", "--bind", "127.0.0.1:0", "--min-replicas", "0"]) as (proc,):
        assert proc.popen.wait(timeout=30) == 2
