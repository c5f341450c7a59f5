"""One request must not stop a job (issue 33): a stranger's single raw ``Quorum``
request claiming step 2**62 is taken into a quorum and then vanishes; the job
keeps committing, its committed step and state file never hold the claim, and a
lighthouse restarted in place on that file serves the job too.

The lighthouse runs as the README launches it (``python -m lighthouse --bind
127.0.0.1:PORT --min-replicas 1``, its state file in its working directory), in a
process of its own, with ``--no-quorum-lease`` so that every step asks it and the
stranger's request is taken into the very next quorum. Two replica groups (a
manager server each, one rank) step from this process; the stranger is
``python -m tests.security.attacker raw``, one gRPC call with a 2 s deadline (the
issue's 0.3 s, lengthened so the groups' requests surely meet it on a loaded
machine; it still sends nothing else). Without a job secret, and with one that
the stranger knows (a stale or buggy process of the job).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from lighthouse import ManagerClient, ManagerServer, QuorumResult
from tests.integration.lh_fixtures import ROOT, quorum_request
from tests.integration.test_lh_manager import in_threads

pytestmark = pytest.mark.timeout(150)
SECRET = "s3cret-for-this-job-only"
CLAIM = 2**62  # 4611686018427387904
T = timedelta(seconds=20)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFT_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


class Lighthouse:
    """``python -m lighthouse`` in a process of its own, in ``workdir``."""

    def __init__(self, workdir: Path, secret_file: Path | None, ports: tuple[int, int]) -> None:
        args = [
            sys.executable, "-m", "lighthouse",
            "--bind", f"127.0.0.1:{ports[0]}", "--http-bind", f"127.0.0.1:{ports[1]}",
            "--min-replicas", "1", "--no-quorum-lease",
            "--state-file", "lighthouse.state.json",
        ]  # fmt: skip
        if secret_file is not None:
            args += ["--job-secret-file", str(secret_file)]
        self.state_file = workdir / "lighthouse.state.json"
        self._log = open(workdir / f"lighthouse-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
        self.popen = subprocess.Popen(
            args, cwd=workdir, env=_env(), stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self.popen.stdout is not None
        stdout = self.popen.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        first = lines.get(timeout=60)  # "lighthouse listening on http://H:P (epoch E) status U ..."
        assert first.startswith("lighthouse listening on http://"), first
        words = first.split()
        self.address = words[3]
        self.status_url = words[words.index("status") + 1] + "/status"
        grpc_port = urllib.parse.urlsplit(self.address).port
        http_port = urllib.parse.urlsplit(self.status_url).port
        assert grpc_port is not None and http_port is not None, first
        self.ports = (grpc_port, http_port)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=10) as r:
            status: dict[str, Any] = json.loads(r.read())
        return status

    def wait_pending(self, replica_id: str) -> None:
        """Until ``replica_id``'s quorum request waits at the lighthouse (at most 20 s)."""
        deadline = time.monotonic() + 20
        while replica_id not in self.status()["next_quorum"]["pending"]:
            assert time.monotonic() < deadline, self.status()["next_quorum"]
            threading.Event().wait(0.01)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown flushes the state file; then by pid, if need be."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._log.close()


class Groups:
    """Two replica groups of one rank each, stepped from this process."""

    def __init__(self, lighthouse_addr: str, secret: str | None, stack: ExitStack) -> None:
        self.servers = []
        for i in range(2):
            ms = ManagerServer(
                f"rep{i}:{uuid.uuid4().hex[:8]}",
                lighthouse_addr,
                bind="127.0.0.1:0",
                store_addr=f"127.0.0.1:{4000 + i}",
                job_secret=secret,
                connect_timeout=timedelta(seconds=30),
            )
            stack.callback(ms.shutdown)
            self.servers.append(ms)
        self.clients = [ManagerClient(ms.address(), job_secret=secret) for ms in self.servers]
        for c in self.clients:
            stack.callback(c.close)
        self.ids = [ms.replica_id for ms in self.servers]

    def ask(self, i: int, step: int) -> QuorumResult:
        return self.clients[i].quorum(quorum_request(0, step, timeout=T))

    def vote(self, step: int) -> None:
        votes = in_threads([partial(c.should_commit, 0, step, True, T) for c in self.clients])
        assert votes == [True, True], votes

    def train(self, start: int, stop: int) -> None:
        """Steps ``start`` to ``stop - 1``: a quorum of both groups and a committed vote each."""
        for step in range(start, stop):
            results = in_threads([partial(self.ask, i, step) for i in range(2)])
            for r in results:
                assert isinstance(r, QuorumResult), r
                assert sorted(r.replica_ids) == sorted(self.ids), r.replica_ids
            self.vote(step)


def _kill(proc: subprocess.Popen[str]) -> None:
    """Stop ``proc`` by its pid if it still runs."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@contextmanager
def job(tmp_path: Path, secret: str | None) -> Iterator[tuple[Lighthouse, Groups, ExitStack]]:
    secret_file = None
    if secret is not None:
        secret_file = tmp_path / "job-secret"
        secret_file.write_text(secret)
        secret_file.chmod(0o600)
    with ExitStack() as stack:
        lh = Lighthouse(tmp_path, secret_file, (0, 0))
        stack.callback(lambda: lh.stop())
        yield lh, Groups(f"127.0.0.1:{lh.ports[0]}", secret, stack), stack


@pytest.mark.parametrize("secret", [None, SECRET], ids=["no secret", "the stranger knows it"])
def test_one_request_claiming_step_2_62_does_not_stop_the_job(
    tmp_path: Path, secret: str | None
) -> None:
    with (
        job(tmp_path, secret) as (lh, groups, stack),
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        groups.train(0, 6)
        assert lh.status()["committed_step"] == 5  # both asked at 5: they hold it together

        # rep0 asks for step 6 and waits for rep1 (the previous quorum's other member)
        first = pool.submit(groups.ask, 0, 6)
        lh.wait_pending(groups.ids[0])
        stranger = "stranger:" + uuid.uuid4().hex[:8]
        attack = [
            sys.executable, "-m", "tests.security.attacker", "raw",
            "--addr", lh.address, "--replica-id", stranger,
            "--step", str(CLAIM), "--deadline-s", "2",
        ]  # fmt: skip
        if secret is not None:
            attack += ["--secret", secret]
        proc = subprocess.Popen(attack, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
        stack.callback(_kill, proc)
        lh.wait_pending(stranger)
        second = pool.submit(groups.ask, 1, 6)
        results = [first.result(timeout=30), second.result(timeout=30)]
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out.strip().splitlines()[-1])["outcomes"] == ["accepted: 3 members"]
        for r in results:  # the stranger was taken into the quorum, as the issue found
            assert stranger in r.replica_ids and len(r.replica_ids) == 3, r.replica_ids
            assert r.max_step == CLAIM and r.heal  # both told to heal from it
        assert lh.status()["committed_step"] == 6  # what both reached; the claim commits nothing
        groups.vote(6)  # (no heal runs here: the groups vote yes regardless)

        # The stranger is gone. Every later quorum used to be refused: "the job has
        # committed step 4611686018427387904 but the askers' highest step is 7".
        groups.train(7, 12)
        status = lh.status()
        assert status["committed_step"] == 11, status["committed_step"]
        assert status["quorum"]["members"] and stranger not in json.dumps(status["quorum"])
        quarantined = [q["replica_id"] for q in status["recent_quarantines"]]
        assert quarantined == [stranger], status["recent_quarantines"]  # its claim refused
        assert "claimed step 4611686018427387904" in status["recent_quarantines"][0]["reason"]

        # The state file never held the claim, and a lighthouse restarted in place on
        # it serves the job: the groups reconnect and commit on.
        ports = lh.ports
        lh.stop()
        record = json.loads(lh.state_file.read_text())
        assert record["committed_step"] == 11 and record["quorum_members"] == 2, record
        again = Lighthouse(tmp_path, None if secret is None else tmp_path / "job-secret", ports)
        stack.callback(again.stop)
        assert again.status()["committed_step"] == 11
        groups.train(12, 15)
        assert again.status()["committed_step"] == 14
    assert json.loads(lh.state_file.read_text())["committed_step"] == 14
