"""Where the job's servers listen: closed unless opened.

Every server a job starts (the lighthouse's gRPC port and its status page, each
replica group's manager server, each rank's checkpoint HTTP server) follows
one rule, so that a job nobody secured is reachable from this machine only:

- with no bind given, it listens on every interface when the job has a secret
  (``TORCHFT_JOB_SECRET`` / ``TORCHFT_JOB_SECRET_FILE``, ``lighthouse.auth``),
  and on loopback when it has none;
- a bind beyond loopback (an interface's address, a host name, a wildcard such
  as ``[::]`` or ``0.0.0.0``) without a job secret is refused with a
  ``ValueError`` naming the server, the address, the secret's variables and
  the opt-out;
- loopback binds (``127.0.0.0/8``, ``::1``, ``localhost``) never need a secret;
- the user opts out explicitly (``TORCHFT_INSECURE=1``, ``--insecure`` on the
  lighthouse's command line, ``insecure=True`` in Python): binds are then as
  before this rule, every interface by default, with one warning per server
  (``auth.warn_if_exposed``);
- a server bound to loopback never advertises an address other machines would
  dial in vain (``check_advertised``).

Pure: no sockets. Reads only ``TORCHFT_INSECURE`` (``insecure_opted_out``).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

from lighthouse.auth import SECRET_ENV, SECRET_FILE_ENV

__all__ = [
    "INSECURE_ENV",
    "LOOPBACK_HOST",
    "LOOPBACK_V4",
    "check_advertised",
    "check_bind",
    "default_host",
    "insecure_opted_out",
    "is_loopback",
]

#: Set to 1 (or true/yes/on) to let servers listen beyond loopback without a job secret.
INSECURE_ENV = "TORCHFT_INSECURE"
#: The loopback bind of a gRPC server. Not ``localhost``: for it gRPC binds ::1 and
#: 127.0.0.1, and when the port it took on the first is taken on the second it
#: binds one alone without failing (measured with port 0: "Only 1 addresses added
#: out of total 2"), so a peer dialing the other address could reach another
#: process. Clients that dial ``localhost`` try 127.0.0.1 after ::1 is refused.
LOOPBACK_HOST = "127.0.0.1"
#: The loopback bind of a Python HTTP server (one address family per socket).
LOOPBACK_V4 = "127.0.0.1"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def insecure_opted_out(insecure: bool | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the user opted out of the rule: ``insecure`` if given, else
    ``$TORCHFT_INSECURE`` (1/true/yes/on; unset, empty, 0/false/no/off: not).
    ``ValueError`` naming the variable for any other value, ``TypeError`` for a
    non-bool ``insecure``."""
    if insecure is not None:
        if not isinstance(insecure, bool):
            raise TypeError(f"insecure must be a bool or None, got {insecure!r}")
        return insecure
    value = (os.environ if env is None else env).get(INSECURE_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{INSECURE_ENV} must be one of 1, true, yes, on (opt out) or 0, false, no, off, "
        f"got {value!r:.40}"
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, with or without brackets, or a name) is this
    machine only: ``127.0.0.0/8``, ``::1`` or a loopback name. A wildcard, an
    interface's address or any other name is not (a name may resolve anywhere)."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_host(
    secret: str | None, insecure: bool, *, loopback: str = LOOPBACK_HOST, wildcard: str = "::"
) -> str:
    """The host to listen on when the user gave none: ``wildcard`` (every interface)
    with a job ``secret`` or when ``insecure``, else ``loopback``."""
    return wildcard if secret is not None or insecure else loopback


def check_bind(what: str, bind: str, bind_host: str, secret: str | None, insecure: bool) -> None:
    """``ValueError`` if ``what`` (e.g. "the lighthouse") would listen on ``bind``
    (whose host is ``bind_host``) beyond loopback with no job ``secret`` and no
    opt-out; the message names the server, the address and every way out."""
    if secret is not None or insecure or is_loopback(bind_host):
        return
    raise ValueError(
        f"{what} would listen on {bind or '*'}, beyond loopback, with no job secret: anyone "
        "who can reach it could join, read, vote in or stop this job. Set the job secret "
        f"in every process of the job ({SECRET_ENV}, or {SECRET_FILE_ENV} naming a file "
        "that holds it; 16+ characters), or bind to 127.0.0.1 for a job on one machine, or "
        f"opt out explicitly with {INSECURE_ENV}=1 (the lighthouse's command line: "
        "--insecure); docs/security.md"
    )


def check_advertised(what: str, bind_host: str, advertised: str) -> None:
    """``ValueError`` if ``what`` listens on loopback (``bind_host``) but would
    advertise ``advertised``, a host other machines would dial in vain."""
    if not is_loopback(bind_host) or is_loopback(advertised):
        return
    raise ValueError(
        f"{what} listens on loopback ({bind_host}) but would advertise {advertised!r}, which "
        "other machines cannot reach it on. Without a job secret servers listen on loopback "
        f"only: for a job on several machines set {SECRET_ENV} (or {SECRET_FILE_ENV}) in "
        "every process, and servers listen on every interface; for a job on one machine "
        "advertise a loopback address (or none)"
    )
