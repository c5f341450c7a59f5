"""Test certificates made with the ``openssl`` command line: a job CA and a server
certificate it signs, and a second, unrelated CA (a "wrong" one).

Keys are P-256 (fast to make); certificates live one day.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from torchft_pg.checkpointing.http_transport import default_advertise_host

__all__ = ["JobCerts", "local_names", "make_ca", "make_job_certs", "make_server_cert"]

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


def _san(names: list[str]) -> str:
    """``subjectAltName`` text for host names and IP addresses."""
    parts = []
    for name in names:
        is_ip = name.replace(".", "").isdigit() or ":" in name
        parts.append(f"{'IP' if is_ip else 'DNS'}:{name}")
    return "subjectAltName=" + ",".join(parts)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA certificate and its key under ``directory``: (cert, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC, "-keyout", str(key), "-out", str(cert), "-days", "1",
        "-subj", f"/CN={name}",
    )  # fmt: skip
    return cert, key


def make_server_cert(
    directory: Path, name: str, ca: tuple[Path, Path], names: list[str]
) -> tuple[Path, Path]:
    """A server certificate for host ``names`` signed by ``ca``: (cert, key)."""
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(_san(names) + "\nbasicConstraints=CA:FALSE\n")
    _openssl("req", "-new", *_EC, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext),
    )  # fmt: skip
    return cert, key


def local_names() -> list[str]:
    """The names a server on this machine may be dialled by in the tests."""
    return sorted({"127.0.0.1", "localhost", socket.gethostname(), default_advertise_host("")})


@dataclass(frozen=True, kw_only=True)
class JobCerts:
    """A job's TLS files (``ca``, ``cert``, ``key``), the CA's key (``ca_key``, to
    sign more certificates) and an unrelated CA (``other_ca``)."""

    ca: Path
    ca_key: Path
    cert: Path
    key: Path
    other_ca: Path

    def env(self) -> dict[str, str]:
        """The environment every process of the job gets."""
        return {
            "TORCHFT_TLS_CERT": str(self.cert),
            "TORCHFT_TLS_KEY": str(self.key),
            "TORCHFT_TLS_CA": str(self.ca),
        }


def make_job_certs(directory: Path) -> JobCerts:
    """A job CA, a server certificate for this machine's names, and another CA."""
    ca = make_ca(directory, "job-ca")
    cert, key = make_server_cert(directory, "server", ca, local_names())
    other_ca, _ = make_ca(directory, "other-ca")
    return JobCerts(ca=ca[0], ca_key=ca[1], cert=cert, key=key, other_ca=other_ca)
