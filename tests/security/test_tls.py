"""TLS on every connection of a job: gRPC to the lighthouse and the manager servers,
and HTTPS for heals. Clients verify servers against the job's CA; plaintext
peers and peers trusting another CA are refused with errors that say where.

Certificates are made by ``openssl`` under the test's temporary directory
(``tests.security.tls_certs``). Servers of the job run in this process or in
replica processes; every stranger runs in a process of its own.
"""

from __future__ import annotations

import http.client
import re
import signal
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from lighthouse import LighthouseClient, LighthouseServer, ManagerClient, ManagerServer
from lighthouse.errors import FaultToleranceError, LighthouseUnavailableError
from lighthouse.tls import TlsConfig, resolve_tls
from tests.integration.lh_fixtures import lighthouse, processes, quorum_request
from tests.integration.test_lh_manager import in_threads
from tests.multiproc import RankContext, run_ranks
from tests.security.healing_job import replica_with_env
from tests.security.tls_certs import JobCerts, make_job_certs, make_server_cert
from torchft_pg.checkpointing import HTTPTransport
from torchft_pg.errors import RecoveryError

pytestmark = pytest.mark.timeout(120)
SECRET = "s3cret-for-this-job-only"
T = timedelta(seconds=10)
TLS_ENV = ("TORCHFT_TLS_CERT", "TORCHFT_TLS_KEY", "TORCHFT_TLS_CA", "TORCHFT_TLS_SERVER_NAME")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> JobCerts:
    return make_job_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def job_tls(certs: JobCerts) -> TlsConfig:
    config = resolve_tls(certs.cert, certs.key, certs.ca)
    assert config is not None
    return config


@pytest.fixture(autouse=True)
def _no_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test says which TLS files it uses; none leak in from the environment."""
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


def _checkpoint_sender(tls: TlsConfig) -> HTTPTransport[dict[str, Any]]:
    sender: HTTPTransport[dict[str, Any]] = HTTPTransport(
        timedelta(seconds=5), bind_host="127.0.0.1", tls=tls
    )
    sender.send_checkpoint([1], 3, {"w": torch.arange(3.0)}, T)
    return sender


def _receive(tls: TlsConfig | None, metadata: str) -> str:
    receiver: HTTPTransport[dict[str, Any]] = HTTPTransport(
        timedelta(seconds=5), bind_host="127.0.0.1", tls=tls
    )
    try:
        return f"got {receiver.recv_checkpoint(0, metadata, 3, T)['w'].tolist()}"
    finally:
        receiver.shutdown()


# -- a whole job over TLS ------------------------------------------------------------------


@pytest.mark.parametrize("secret", [None, SECRET], ids=["tls", "tls+secret"])
def test_a_job_with_tls_in_its_environment_trains_and_heals_over_https(
    certs: JobCerts, job_tls: TlsConfig, secret: str | None
) -> None:
    env = certs.env() | ({"TORCHFT_JOB_SECRET": secret} if secret else {})
    with LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, job_secret=secret, tls=job_tls
    ) as lh:
        # 127.0.0.1: a name the job's certificate carries
        r0, r1 = run_ranks(replica_with_env, 2, lh.address(), env, "127.0.0.1", timeout=120)
    assert r0["step"] == r1["step"] >= 6
    assert 2 in r0["participants"] and 2 in r1["participants"]
    # Replica 1 started at 100s and joined at step 2: its weights equal replica 0's
    # only if it healed. Its checkpoint client had TLS from the environment and
    # refuses a plain http:// sender, so the heal was HTTPS.
    assert r0["w"] == r1["w"]


# -- plaintext peers ------------------------------------------------------------------------


def _plaintext_strangers(ctx: RankContext) -> list[str]:
    lighthouse_addr, manager_addr = ctx.args
    out = []
    try:
        LighthouseClient(lighthouse_addr, timedelta(seconds=1)).quorum(
            "intruder", timedelta(seconds=2), step=1000
        )
        out.append("accepted")
    except FaultToleranceError as e:
        out.append(str(e))
    try:  # a vote ahead: had it counted, the group's step 1 would be abandoned
        ManagerClient(manager_addr, timedelta(seconds=1)).should_commit(
            0, 7, True, timedelta(seconds=2)
        )
        out.append("accepted")
    except FaultToleranceError as e:
        out.append(str(e))
    return out


def test_tls_servers_refuse_plaintext_clients_and_nothing_changes(job_tls: TlsConfig) -> None:
    with (
        lighthouse(min_replicas=1, tls=job_tls) as lh,
        ManagerServer("rep0", lh.address(), bind="127.0.0.1:0", world_size=2, tls=job_tls) as ms,
    ):
        member = ManagerClient(ms.address(), tls=job_tls)
        in_threads([partial(member.quorum, quorum_request(g, 1)) for g in range(2)])
        refusals = run_ranks(_plaintext_strangers, 1, lh.address(), ms.address())[0]
        for refusal, addr in zip(refusals, (lh.bare_address(), ms.address()), strict=True):
            assert refusal.startswith(("quorum request", "commit vote")), refusal
            assert addr in refusal and "unreachable" in refusal, refusal
        assert "intruder" not in str(lh.status())
        votes = in_threads([partial(member.should_commit, g, 1, True, T) for g in range(2)])
        assert votes == [True, True]

    sender = _checkpoint_sender(job_tls)
    try:
        assert sender.metadata().startswith("https://127.0.0.1:")
        conn = http.client.HTTPConnection("127.0.0.1", sender.port, timeout=5)
        with pytest.raises((OSError, http.client.HTTPException)):
            conn.request("GET", "/checkpoint/3/meta?wait_ms=1000")
            conn.getresponse().read()  # the server hangs up during its TLS handshake
        conn.close()
        assert _receive(job_tls, sender.metadata()) == "got [0.0, 1.0, 2.0]"
        # A receiver without TLS says so instead of sending its request in clear text.
        with pytest.raises(ValueError, match=r"serves HTTPS but this receiver has no TLS"):
            _receive(None, sender.metadata())
    finally:
        sender.shutdown()


# -- the wrong CA, the wrong name -----------------------------------------------------------


def test_clients_that_trust_another_ca_fail_naming_the_address(
    certs: JobCerts, job_tls: TlsConfig
) -> None:
    wrong = resolve_tls(certs.cert, certs.key, certs.other_ca)
    assert wrong is not None
    verify_failed = "CERTIFICATE_VERIFY_FAILED"
    with (
        lighthouse(min_replicas=1, tls=job_tls) as lh,
        ManagerServer("rep0", lh.address(), bind="127.0.0.1:0", tls=job_tls) as ms,
    ):
        with pytest.raises(FaultToleranceError) as manager_call:
            ManagerClient(ms.address(), timedelta(seconds=1), tls=wrong).quorum(
                quorum_request(0, 1)
            )
        assert ms.address() in str(manager_call.value), manager_call.value
        assert verify_failed in str(manager_call.value), manager_call.value

        with pytest.raises(LighthouseUnavailableError) as link:
            ManagerServer(
                "rep1",
                lh.address(),
                bind="127.0.0.1:0",
                tls=wrong,
                connect_timeout=timedelta(seconds=1),
            ).shutdown()
        assert f"lighthouse at {lh.bare_address()}" in str(link.value), link.value
        assert verify_failed in str(link.value), link.value
        assert "rep1" not in str(lh.status())

    sender = _checkpoint_sender(job_tls)
    try:
        with pytest.raises(RecoveryError) as heal:
            _receive(wrong, sender.metadata())
        assert sender.metadata() in str(heal.value), heal.value
        assert "certificate verify failed" in str(heal.value), heal.value
    finally:
        sender.shutdown()


def test_a_certificate_for_another_name_is_refused_unless_that_name_is_expected(
    certs: JobCerts, tmp_path: Path
) -> None:
    cert, key = make_server_cert(tmp_path, "shared", (certs.ca, certs.ca_key), ["torchft-job"])
    serving = resolve_tls(cert, key, certs.ca)
    # Clients dialling 127.0.0.1; they also serve (every checkpoint transport does).
    by_name = resolve_tls(certs.cert, certs.key, certs.ca, server_name="torchft-job")
    by_host = resolve_tls(certs.cert, certs.key, certs.ca)
    assert serving is not None and by_name is not None and by_host is not None
    with lighthouse(min_replicas=1, join_timeout_ms=100, tls=serving) as lh:
        with pytest.raises(LighthouseUnavailableError, match=r"127\.0\.0\.1.*(?i:hostname)"):
            LighthouseClient(lh.address(), timedelta(seconds=1), tls=by_host).quorum("a", T)
        quorum = LighthouseClient(lh.address(), tls=by_name).quorum("a", T)
        assert [p.replica_id for p in quorum.participants] == ["a"]

    sender = _checkpoint_sender(serving)
    try:
        with pytest.raises(RecoveryError, match=r"certificate verify failed: IP address mismatch"):
            _receive(by_host, sender.metadata())
        assert _receive(by_name, sender.metadata()) == "got [0.0, 1.0, 2.0]"
    finally:
        sender.shutdown()


# -- TLS and the job secret together ---------------------------------------------------------


def test_tls_and_the_secret_are_both_required_when_both_are_set(job_tls: TlsConfig) -> None:
    ca_only = resolve_tls(ca=job_tls.ca)
    with (
        lighthouse(min_replicas=1, job_secret=SECRET, tls=job_tls) as lh,
        ManagerServer(
            "rep0", lh.address(), bind="127.0.0.1:0", job_secret=SECRET, tls=job_tls
        ) as ms,
    ):
        with pytest.raises(FaultToleranceError, match=r"UNAUTHENTICATED.*job secret") as no_secret:
            ManagerClient(ms.address(), tls=ca_only).quorum(quorum_request(0, 1))
        assert SECRET not in str(no_secret.value)
        with pytest.raises(FaultToleranceError, match=r"unreachable"):
            ManagerClient(ms.address(), timedelta(seconds=1), job_secret=SECRET).quorum(
                quorum_request(0, 1)
            )
        both = ManagerClient(ms.address(), job_secret=SECRET, tls=ca_only)
        assert both.quorum(quorum_request(0, 1)).replica_ids == ["rep0"]
        assert both.should_commit(0, 1, True, T) is True


# -- configuration ----------------------------------------------------------------------------


def test_tls_files_come_from_arguments_or_the_environment_with_clear_errors(
    certs: JobCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_tls() is None  # nothing set: TLS off, connections as without TLS
    for name, value in certs.env().items():
        monkeypatch.setenv(name, value)
    from_env = resolve_tls()
    assert from_env is not None and from_env.can_serve and from_env.ca == certs.ca
    assert "BEGIN" not in repr(from_env)  # the key's bytes never reach a log line
    monkeypatch.delenv("TORCHFT_TLS_CA")
    self_signed = resolve_tls()
    assert self_signed is not None and self_signed.ca_pem == certs.cert.read_bytes()
    by_argument = resolve_tls(ca=certs.other_ca)
    assert by_argument is not None and by_argument.ca == certs.other_ca  # an argument wins

    monkeypatch.delenv("TORCHFT_TLS_KEY")
    with pytest.raises(ValueError, match=r"\$TORCHFT_TLS_CERT is set but TORCHFT_TLS_KEY"):
        resolve_tls()
    monkeypatch.delenv("TORCHFT_TLS_CERT")
    missing = tmp_path / "missing.pem"
    with pytest.raises(
        ValueError, match=rf"cannot read the TLS CA bundle '{re.escape(str(missing))}'"
    ):
        resolve_tls(ca=missing)
    not_pem = tmp_path / "not.pem"
    not_pem.write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match=r"must be a PEM file, got 2 bytes"):
        resolve_tls(ca=not_pem)
    with pytest.raises(ValueError, match=r"does not fit the certificate"):
        resolve_tls(certs.cert, certs.ca_key)
    ca_only = resolve_tls(ca=certs.ca)
    assert ca_only is not None
    with pytest.raises(ValueError, match=r"the lighthouse serves TLS and needs a certificate"):
        LighthouseServer(bind="127.0.0.1:0", tls=ca_only)


CLI = [
    "-m", "lighthouse", "--bind", "127.0.0.1:0", "--http-bind", "none", "--state-file", "none",
    "--min-replicas", "1", "--join-timeout-ms", "100",
]  # fmt: skip


def test_the_cli_serves_tls_with_its_flags(certs: JobCerts, job_tls: TlsConfig) -> None:
    flags = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--tls-ca", str(certs.ca)]
    with processes([*CLI, *flags]) as (proc,):
        line = proc.next_line(30)
        m = re.match(r"lighthouse listening on (\S+) \(epoch \w+\).* TLS on$", line.strip())
        assert m, line
        assert LighthouseClient(m.group(1), tls=job_tls).quorum("a", T).quorum_id == 1
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=20) == 0
    with processes([*CLI, "--tls-cert", str(certs.cert)]) as (proc,):
        assert proc.popen.wait(timeout=30) == 2  # a certificate without its key
