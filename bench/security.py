"""What job authentication and TLS cost: quorum rounds and a heal, with auth off,
the job secret on, and the secret plus TLS, as ratios to "off" in one run.

* Quorum round: one lighthouse (quorum leases off, so every round reaches it)
  and 3 manager servers in this process; each replica's rank asks over a
  gRPC ``ManagerClient`` (3 threads, one call each per round), then the three
  vote. "round" times the quorum calls, "step" the quorum plus the vote.
* New channel: a fresh ``ManagerClient`` and its first call (connection set-up,
  the TLS handshake included).
* Heal: a child process serves a ~100 MB fp32 state dict with one
  ``HTTPTransport`` per mode; this process receives it in place (one stream,
  the Manager's default).
* CPU rows: CPU seconds of this process (``time.process_time``) over the same
  calls; on a shared machine they vary less than wall time. The child is forked at the start, before any
  server or channel exists.

The three setups are measured round-robin, in blocks, so load from other work
on a shared machine spreads evenly over them. TLS uses a self-signed
certificate made with ``openssl`` in a temporary directory. Environment
variables ``TORCHFT_JOB_SECRET*`` and ``TORCHFT_TLS_*`` are cleared first: each
mode passes its own settings.

    .venv/bin/python bench/security.py [--rounds 300] [--mb 100] [--heals 5]

Prints a table, then one JSON line. Bounded: about a minute on 2 cores; every
receive has a 30 s timeout, and the serving child is stopped by its pid.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

for _name in list(os.environ):  # every mode below says what it uses
    if _name.startswith(("TORCHFT_JOB_SECRET", "TORCHFT_TLS_")):
        del os.environ[_name]

import torch  # noqa: E402

from lighthouse import LighthouseServer, ManagerClient, ManagerQuorumRequest, ManagerServer  # noqa: E402
from lighthouse.tls import TlsConfig, resolve_tls  # noqa: E402
from torchft_pg.checkpointing import HTTPTransport  # noqa: E402

MODES = ("off", "secret", "secret+tls")
SECRET = "bench-secret-of-this-job-0123456789"
REPLICAS = 3
T = timedelta(seconds=30)
STEP = 7
BLOCK = 25  # rounds of one mode before the next mode's turn


@dataclass(frozen=True, kw_only=True)
class Mode:
    """One way to run the job: its secret and TLS files (None: off)."""

    name: str
    secret: str | None
    tls: TlsConfig | None


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for 127.0.0.1 and its key: (cert, key)."""
    cert, key = directory / "job.crt", directory / "job.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=bench",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def modes(directory: Path) -> list[Mode]:
    cert, key = make_cert(directory)
    return [
        Mode(name="off", secret=None, tls=None),
        Mode(name="secret", secret=SECRET, tls=None),
        Mode(name="secret+tls", secret=SECRET, tls=resolve_tls(cert, key)),
    ]


def state_dict(mb: int) -> dict[str, torch.Tensor]:
    """~`mb` MB of fp32 in 8 tensors."""
    n = mb * 1024 * 1024 // 4 // 8
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(8)}


def serve(all_modes: list[Mode], mb: int, conn: Connection) -> None:
    """The child: serve one state dict per mode, send their addresses, wait for "stop"."""
    sd = state_dict(mb)
    senders = {}
    for m in all_modes:
        t: HTTPTransport[dict[str, torch.Tensor]] = HTTPTransport(
            T, bind_host="127.0.0.1", job_secret=m.secret, tls=m.tls
        )
        t.send_checkpoint([1], STEP, sd, T)
        senders[m.name] = t
    conn.send({name: t.metadata() for name, t in senders.items()})
    conn.recv()
    for t in senders.values():
        t.shutdown(wait=False)


def start_sender(all_modes: list[Mode], mb: int) -> tuple[mp.process.BaseProcess, Connection]:
    """The serving child, forked before this process starts any gRPC or HTTP server
    (so it needs no imports of its own); returns it and its pipe."""
    parent, child_conn = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(
        target=serve, args=(all_modes, mb, child_conn), daemon=True
    )
    proc.start()
    child_conn.close()
    return proc, parent


class QuorumJob:
    """A lighthouse and REPLICAS manager servers of one mode, with a client per replica."""

    def __init__(self, mode: Mode) -> None:
        self.lighthouse = LighthouseServer(
            bind="127.0.0.1:0",
            min_replicas=REPLICAS,
            join_timeout_ms=100,
            quorum_lease=False,
            job_secret=mode.secret,
            tls=mode.tls,
        )
        self.servers = [
            ManagerServer(
                f"{mode.name}-{i}",
                self.lighthouse.address(),
                bind="127.0.0.1:0",
                job_secret=mode.secret,
                tls=mode.tls,
            )
            for i in range(REPLICAS)
        ]
        self.mode = mode
        self.clients = [self.client(s.address()) for s in self.servers]
        self.step = 0

    def client(self, addr: str) -> ManagerClient:
        return ManagerClient(addr, job_secret=self.mode.secret, tls=self.mode.tls)

    def round(self, pool: ThreadPoolExecutor) -> tuple[float, float, float]:
        """One step: every replica's quorum, then every vote; (round s, step s, step CPU s
        of this process: the lighthouse, the manager servers and the clients)."""
        self.step += 1
        req = ManagerQuorumRequest(group_rank=0, step=self.step, checkpoint_metadata="", timeout=T)
        c0, t0 = time.process_time(), time.perf_counter()
        for f in [pool.submit(c.quorum, req) for c in self.clients]:
            f.result()
        t1 = time.perf_counter()
        votes = [pool.submit(c.should_commit, 0, self.step, True, T) for c in self.clients]
        if not all(f.result() for f in votes):
            raise RuntimeError(f"{self.mode.name}: step {self.step} was not committed")
        return t1 - t0, time.perf_counter() - t0, time.process_time() - c0

    def new_channel(self) -> float:
        """Seconds for a fresh client's first call."""
        t0 = time.perf_counter()
        client = self.client(self.servers[0].address())
        client.checkpoint_metadata(0, T)
        elapsed = time.perf_counter() - t0
        client.close()
        return elapsed

    def shutdown(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.shutdown()
        self.lighthouse.shutdown()


def measure_quorum(all_modes: list[Mode], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Round, step and new-channel seconds per mode, measured round-robin in blocks."""
    jobs = {m.name: QuorumJob(m) for m in all_modes}
    out: dict[str, dict[str, list[float]]] = {
        m: {"round": [], "step": [], "cpu": [], "channel": []} for m in jobs
    }
    try:
        with ThreadPoolExecutor(max_workers=REPLICAS) as pool:
            for job in jobs.values():  # warm-up: the first quorum waits for all three
                for _ in range(3):
                    job.round(pool)
            for _ in range(max(1, rounds // BLOCK)):
                for name, job in jobs.items():
                    for _ in range(BLOCK):
                        r, s, c = job.round(pool)
                        out[name]["round"].append(r)
                        out[name]["step"].append(s)
                        out[name]["cpu"].append(c)
                    out[name]["channel"].append(job.new_channel())
    finally:
        for job in jobs.values():
            job.shutdown()
    return out


def measure_heal(
    all_modes: list[Mode], heals: int, sender: Connection
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per heal and mode from the serving child, round-robin: (wall, CPU of
    this process, the receiver)."""
    if not sender.poll(120):
        raise RuntimeError("the serving child did not report its addresses within 120 s")
    urls: dict[str, str] = sender.recv()
    receivers = {}
    for m in all_modes:
        holder: dict[str, Any] = {}

        def current(h: dict[str, Any] = holder) -> Any:
            return h.get("sd")

        t: HTTPTransport[dict[str, torch.Tensor]] = HTTPTransport(
            T,
            bind_host="127.0.0.1",
            state_dict=current,
            job_secret=m.secret,
            tls=m.tls,
        )
        holder["sd"] = t.recv_checkpoint(0, urls[m.name], STEP, T)  # warm: buffers exist
        receivers[m.name] = t
    times: dict[str, list[float]] = {m.name: [] for m in all_modes}
    cpu: dict[str, list[float]] = {m.name: [] for m in all_modes}
    for _ in range(heals):
        for name, t in receivers.items():
            c0, t0 = time.process_time(), time.perf_counter()
            t.recv_checkpoint(0, urls[name], STEP, T)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    for t in receivers.values():
        t.shutdown(wait=False)
    return times, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300, help="timed quorum rounds per mode")
    ap.add_argument("--mb", type=int, default=100, help="heal state size in MB")
    ap.add_argument("--heals", type=int, default=5, help="timed heals per mode")
    args = ap.parse_args()
    logging.getLogger("lighthouse").setLevel(logging.ERROR)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        all_modes = modes(Path(tmp))
        proc, sender = start_sender(all_modes, args.mb)
        try:
            quorum = measure_quorum(all_modes, args.rounds)
            heal, heal_cpu = measure_heal(all_modes, args.heals, sender)
            sender.send("stop")
            proc.join(10)
        finally:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(5)
    nbytes = args.mb * 1024 * 1024
    rows: dict[str, dict[str, float]] = {}
    for label, unit, samples in (
        (f"quorum round, {REPLICAS} replicas (ms)", 1e3, {m: quorum[m]["round"] for m in MODES}),
        ("step: quorum + commit vote (ms)", 1e3, {m: quorum[m]["step"] for m in MODES}),
        ("step CPU, all parties (ms)", 1e3, {m: quorum[m]["cpu"] for m in MODES}),
        ("new channel + first call (ms)", 1e3, {m: quorum[m]["channel"] for m in MODES}),
        (f"heal of {args.mb} MiB over HTTP (s)", 1.0, heal),
        ("heal CPU, receiver (s)", 1.0, heal_cpu),
    ):
        rows[label] = {m: statistics.median(samples[m]) * unit for m in MODES}
    print(
        f"median per mode; ratio = mode / off in this run; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"{'scenario':<38}{'off':>9}{'secret':>9}{'sec+tls':>9}{'secret/off':>11}{'tls/off':>9}")
    for label, r in rows.items():
        print(
            f"{label:<38}{r['off']:>9.3f}{r['secret']:>9.3f}{r['secret+tls']:>9.3f}"
            f"{r['secret'] / r['off']:>11.2f}{r['secret+tls'] / r['off']:>9.2f}"
        )
    heal_label = f"heal of {args.mb} MiB over HTTP (s)"
    print(
        "heal throughput GB/s: "
        + ", ".join(f"{m} {nbytes / rows[heal_label][m] / 1e9:.2f}" for m in MODES)
    )
    samples_n = {"quorum_rounds": len(quorum["off"]["round"]), "heals": len(heal["off"])}
    print(
        json.dumps(
            {
                "bench": "security",
                "samples": samples_n,
                "results": {
                    label: {
                        **{m: round(v, 4) for m, v in r.items()},
                        "ratio_secret": round(r["secret"] / r["off"], 3),
                        "ratio_secret_tls": round(r["secret+tls"] / r["off"], 3),
                    }
                    for label, r in rows.items()
                },
                "wall_s": round(time.monotonic() - t_start, 1),
                "cpus": os.cpu_count(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
