"""Hosts in their own network namespaces, joined through a hub, with partitions and impaired links.

`Network(hosts)` makes one namespace per host (``tfpg-<pid>-<host>``) and a
hub namespace (``tfpg-<pid>-hub``) holding a bridge; each host's ``eth0`` is
one end of a veth pair whose other end (``p<i>``) is a bridge port in the hub.
Hosts get their addresses from the benchmarking range 198.18.0.0/15 only, and
nothing else: no default route, so anything that assumes another address
(loopback, the machine's hostname) fails to reach a peer.

Faults, all applied in the hub so the hosts' own stacks see nothing but lost
packets:

* `block(a, b)` / `unblock(a, b)`: drop every IP packet between hosts a and b
  (both directions) at the hub's ports, a silent partition: TCP sees only
  retransmissions, like a cable pulled between switches.
* `impair(delay_ms, loss_pct)`: every link delays each frame and loses it with
  that probability (one way). With `tc netem` when the kernel has it, on each
  host's ``eth0``; otherwise the hub's ports leave the bridge and
  `tests/chaos/linkemu.py` forwards between them in userspace with the same
  semantics. `unimpair()` restores plain links.

Teardown deletes every namespace it made (which deletes their veths too),
also when the test fails, and at interpreter exit if the context was never
left; namespaces left by an earlier run whose process is gone are deleted on
set-up. `available()` says why namespaces cannot be used here, for a visible
skip.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["BENCH_NET", "Network", "available", "die_with_parent"]

#: The only addresses these tests give hosts (RFC 2544 benchmarking range).
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
_PREFIX = "tfpg-"
_LINKEMU = Path(__file__).with_name("linkemu.py")
_CMD_TIMEOUT_S = 20.0


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


def die_with_parent() -> None:
    """A `Popen` preexec_fn: SIGKILL the child when the test process dies (prctl
    PR_SET_PDEATHSIG), so a test killed before its teardown leaves no process
    running in a namespace. It survives ``ip netns exec``, which execs."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def available() -> str | None:
    """None if network namespaces can be made here, else why not (for pytest.skip)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespace tests need root (ip netns add)"
    try:
        probe = f"{_PREFIX}{os.getpid()}-probe"
        result = _run("ip", "netns", "add", probe, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run `ip netns add`: {e}"
    if result.returncode != 0:
        return f"`ip netns add` is not permitted here: {result.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete ``tfpg-<pid>-*`` namespaces whose process is gone (a run killed before teardown)."""
    removed = []
    listing = _run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in listing[:1000]:
        name = line.split(" ", 1)[0]
        if not name.startswith(_PREFIX):
            continue
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


class Network:
    """See the module docstring. `hosts`: host name -> IPv4 address in 198.18.0.0/15."""

    def __init__(self, hosts: Mapping[str, str]) -> None:
        for name, addr in hosts.items():
            if ipaddress.ip_address(addr) not in BENCH_NET:
                raise ValueError(f"host {name}: {addr} is outside {BENCH_NET}")
            if not name.isalnum() or len(name) > 16:
                raise ValueError(f"host name must be alphanumeric, at most 16, got {name!r}")
        self.hosts = dict(hosts)
        self.tag = f"{_PREFIX}{os.getpid()}-"
        self.hub = f"{self.tag}hub"
        self._made: list[str] = []
        self._port = {name: f"p{i}" for i, name in enumerate(self.hosts)}
        self._blocked: set[tuple[str, str]] = set()
        self._emulator: subprocess.Popen[str] | None = None
        self._netem = False
        self.impairment = "none"  # what impair() used: "netem", "linkemu" or "none"

    def ns(self, host: str) -> str:
        return f"{self.tag}{host}"

    def addr(self, host: str) -> str:
        return self.hosts[host]

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `host`'s namespace."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    # -- set-up and teardown ---------------------------------------------------
    def __enter__(self) -> Network:
        remove_stale()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _tc(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", ns, "tc", *args, check=check)

    def _build(self) -> None:
        self._add_ns(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for host, addr in self.hosts.items():
            ns, port = self.ns(host), self._port[host]
            self._add_ns(ns)
            _run(
                "ip", "link", "add", port, "netns", self.hub, "type", "veth",
                "peer", "name", "eth0", "netns", ns,
            )  # fmt: skip
            _run("ip", "-n", self.hub, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/{BENCH_NET.prefixlen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            # Egress toward the host: class 1:1 passes, 1:2 is a blackhole that
            # block() steers the partitioned sources into.
            self._tc(self.hub, "qdisc", "add", "dev", port, "root", "handle", "1:", "htb", "default", "1", "r2q", "100000")  # fmt: skip
            for cls in ("1:1", "1:2"):
                self._tc(self.hub, "class", "add", "dev", port, "parent", "1:", "classid", cls, "htb", "rate", "10gbit")  # fmt: skip
            self._tc(self.hub, "qdisc", "add", "dev", port, "parent", "1:2", "handle", "20:", "blackhole")  # fmt: skip
        first = self._port[next(iter(self.hosts))]
        probe = self._tc(self.hub, "qdisc", "add", "dev", first, "parent", "1:1", "handle", "30:", "netem", "delay", "1ms", check=False)  # fmt: skip
        self._netem = probe.returncode == 0
        if self._netem:
            self._tc(self.hub, "qdisc", "del", "dev", first, "parent", "1:1", "handle", "30:")

    def close(self) -> None:
        """Stop the emulator and delete every namespace made (idempotent)."""
        self._stop_emulator()
        for name in reversed(self._made):
            _run("ip", "netns", "del", name, check=False)
        self._made.clear()
        atexit.unregister(self.close)

    def leftovers(self) -> list[str]:
        """Namespaces of this network that still exist (empty after `close`)."""
        listing = _run("ip", "netns", "list", check=False).stdout.split("\n")
        return [ln.split(" ", 1)[0] for ln in listing if ln.startswith(self.tag)]

    # -- partitions ------------------------------------------------------------
    def _filter(self, action: str, to_host: str, from_host: str) -> None:
        prio = str(list(self.hosts).index(from_host) + 1)
        args = ["filter", action, "dev", self._port[to_host], "parent", "1:", "protocol", "ip"]
        args += ["prio", prio]
        if action == "add":
            args += ["u32", "match", "ip", "src", f"{self.addr(from_host)}/32", "flowid", "1:2"]
        self._tc(self.hub, *args)

    def block(self, a: str, b: str) -> None:
        """Drop every IP packet between hosts `a` and `b`, both ways."""
        if (a, b) in self._blocked:
            return
        self._filter("add", a, b)
        self._filter("add", b, a)
        self._blocked |= {(a, b), (b, a)}

    def unblock(self, a: str, b: str) -> None:
        if (a, b) not in self._blocked:
            return
        self._filter("del", a, b)
        self._filter("del", b, a)
        self._blocked -= {(a, b), (b, a)}

    def dropped(self, host: str) -> int:
        """Packets the partitions dropped on their way to `host` (the blackhole's count)."""
        out = self._tc(self.hub, "-s", "qdisc", "show", "dev", self._port[host]).stdout
        lines = out.splitlines()
        for i, line in enumerate(lines[:100]):
            if line.startswith("qdisc blackhole") and i + 1 < len(lines):
                # " Sent 0 bytes 0 pkt (dropped N, overlimits ..."
                return int(lines[i + 1].split("dropped ", 1)[1].split(",", 1)[0])
        return 0

    # -- impaired links --------------------------------------------------------
    def impair(self, delay_ms: float, loss_pct: float, seed: int = 0) -> str:
        """Delay and loss on every link; returns how ("netem" or "linkemu")."""
        self.unimpair()
        if self._netem:
            for host in self.hosts:
                _run(
                    "ip", "netns", "exec", self.ns(host), "tc", "qdisc", "replace", "dev", "eth0",
                    "root", "netem", "delay", f"{delay_ms}ms", "loss", f"{loss_pct}%",
                )  # fmt: skip
            self.impairment = "netem"
            return self.impairment
        for port in self._port.values():
            _run("ip", "-n", self.hub, "link", "set", port, "nomaster")
            _run("ip", "-n", self.hub, "link", "set", port, "promisc", "on")
        argv = [sys.executable, str(_LINKEMU), "--delay-ms", str(delay_ms)]
        argv += ["--loss-pct", str(loss_pct), "--seed", str(seed), *self._port.values()]
        self._emulator = subprocess.Popen(
            ["ip", "netns", "exec", self.hub, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        assert self._emulator.stdout is not None
        line = self._emulator.stdout.readline()  # bounded: it prints or exits at once
        if line.strip() != "ready":
            err = self._stop_emulator()
            raise RuntimeError(f"link emulator did not start: {line!r} {err}")
        self.impairment = "linkemu"
        return self.impairment

    def unimpair(self) -> str:
        """Plain links again; returns the emulator's last words (empty for netem)."""
        if self.impairment == "netem":
            for host in self.hosts:
                _run("ip", "netns", "exec", self.ns(host), "tc", "qdisc", "del", "dev", "eth0", "root", check=False)  # fmt: skip
        said = self._stop_emulator()
        if self.impairment == "linkemu":
            for port in self._port.values():
                _run("ip", "-n", self.hub, "link", "set", port, "master", "br0")
        self.impairment = "none"
        return said

    def _stop_emulator(self) -> str:
        proc, self._emulator = self._emulator, None
        if proc is None:
            return ""
        with contextlib.suppress(OSError):
            proc.terminate()  # `ip netns exec` execs the emulator: this is its pid
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=10)
        return (out + err).strip()
