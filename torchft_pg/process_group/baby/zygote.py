"""A zygote for Baby children: one interpreter that imported torch once and forks each child.

A child started as a fresh interpreter pays an ``import torch``: seconds of
CPU, tens of seconds on a loaded machine. A child that replaces a killed one
(an abort with an op in flight) is needed at once, so a Baby group keeps a
zygote: started once, it forks every later child in milliseconds, ready to
serve. The zygote never builds a backend itself, initializes no CUDA and runs
one thread, so a fork of it is as safe as a fresh interpreter.

Protocol on a SOCK_SEQPACKET pair, one request at a time (the parent's lock):

- zygote -> parent: ``ready`` once it has imported everything;
- parent -> zygote: ``spawn BACKEND DEVICE`` carrying the child's socket (SCM_RIGHTS);
- zygote -> parent: ``pid PID`` carrying the read end of the child's status pipe.

The zygote reaps its children (SIGCHLD) and writes each one's exit code into
its status pipe, so the parent learns it as it would from ``waitpid``. The
zygote exits when the parent's socket closes; its children live on until
their own sockets close (the parent died or shut them down).

Started as ``python -m torchft_pg.process_group.baby.child zygote FD`` (`zygote_main`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from datetime import timedelta

__all__ = ["ForkedProcess", "Zygote", "child_env", "zygote_main", "zygote_supported"]

_STATUS = struct.Struct("i")
_MAX_MESSAGE = 256
_STATUS_WAIT_S = 5.0  # after a child exited, how long its zygote may take to report the code
_CLOSE_WAIT_S = 5.0  # close(): how long the zygote may take to exit before it is killed
UNKNOWN_EXIT = -255  # the child exited but its zygote was gone before reporting the code


def zygote_supported() -> bool:
    """Forked children need pidfds (Linux 5.3+) and fd passing."""
    return hasattr(os, "pidfd_open") and hasattr(socket, "send_fds") and sys.platform == "linux"


def child_env() -> dict[str, str]:
    import torchft_pg

    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torchft_pg.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


class ForkedProcess:
    """A child forked by the zygote, with the ``pid``/``poll``/``wait``/``send_signal``
    of a ``subprocess.Popen``. It is the zygote's child, not ours: a pidfd tells
    when it exited, its status pipe what code it exited with."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd = status_fd
        # Taken while the child cannot have exited: it serves until its socket closes.
        self._pidfd = os.pidfd_open(pid)
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._reap(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._reap(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked Baby child {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self.returncode is None and self._pidfd >= 0:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def _reap(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(None if timeout is None else int(timeout * 1000)):
                return None  # still running
            self.returncode = self._read_status()
            os.close(self._pidfd)
            os.close(self._status_fd)
            self._pidfd = self._status_fd = -1
            return self.returncode

    def _read_status(self) -> int:
        """The code the zygote reports once it reaped the child (promptly, on SIGCHLD)."""
        poller = select.poll()
        poller.register(self._status_fd, select.POLLIN)
        if not poller.poll(int(_STATUS_WAIT_S * 1000)):
            return UNKNOWN_EXIT
        data = os.read(self._status_fd, _STATUS.size)
        return _STATUS.unpack(data)[0] if len(data) == _STATUS.size else UNKNOWN_EXIT

    def __del__(self) -> None:
        for fd in (getattr(self, "_pidfd", -1), getattr(self, "_status_fd", -1)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class Zygote:
    """The parent's handle on one zygote; constructing it returns at once (it imports torch
    meanwhile)."""

    def __init__(self) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        self._ready = False
        self._broken: str | None = None
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchft_pg.process_group.baby.child",
                "zygote",
                str(theirs.fileno()),
            ],
            pass_fds=(theirs.fileno(),),
            env=child_env(),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()

    @property
    def usable(self) -> bool:
        """Not known to be broken (it may still be starting)."""
        return self._broken is None and self.proc.poll() is None

    def wait_ready(self, timeout: timedelta) -> None:
        """Wait up to `timeout` until the zygote has started; OSError if it cannot."""
        with self._lock:
            self._wait_ready_locked(timeout)

    def _wait_ready_locked(self, timeout: timedelta) -> None:
        if self._broken is not None:
            raise OSError(self._broken)
        if self._ready:
            return
        try:
            self._expect(b"ready", timeout.total_seconds())
        except (OSError, ValueError) as e:
            self._broken = f"Baby zygote (pid {self.proc.pid}) did not start: {e}"
            raise OSError(self._broken) from e
        self._ready = True

    def spawn(
        self, child_sock: socket.socket, backend: str, device: str, timeout: timedelta
    ) -> ForkedProcess:
        """Fork a child serving on `child_sock`; waits up to `timeout` for the zygote to
        have started. Raises OSError if it cannot (the caller starts the child itself)."""
        with self._lock:
            self._wait_ready_locked(timeout)
            try:
                socket.send_fds(
                    self._sock, [f"spawn {backend} {device}".encode()], [child_sock.fileno()]
                )
                data, fds = self._expect(b"pid ", timeout.total_seconds(), want_fd=True)
                return ForkedProcess(int(data[4:]), fds[0])
            except (OSError, ValueError) as e:
                self._broken = f"Baby zygote (pid {self.proc.pid}) failed: {e}"
                raise OSError(self._broken) from e

    def _expect(
        self, prefix: bytes, timeout_s: float, want_fd: bool = False
    ) -> tuple[bytes, list[int]]:
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        if not poller.poll(int(timeout_s * 1000)):
            raise OSError(f"no {prefix.decode().strip()!r} within {timeout_s:g} s")
        data, fds, _, _ = socket.recv_fds(self._sock, _MAX_MESSAGE, 1)
        if not data.startswith(prefix) or (want_fd and len(fds) != 1):
            for fd in fds:
                os.close(fd)
            raise ValueError(f"unexpected reply {data[:40]!r}")
        return data, list(fds)

    def close(self) -> None:
        """Stop the zygote (its children live on until their own sockets close). One
        that never forked (still importing torch, say) is killed at once."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if not self._ready:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=_CLOSE_WAIT_S)


# -- the zygote process -------------------------------------------------------------


def _serve(ctl: socket.socket) -> None:
    """Fork a child per request until the parent's socket closes."""
    from torchft_pg.process_group.baby import child

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
    status: dict[int, int] = {}  # child pid -> write end of its status pipe
    poller = select.poll()
    poller.register(ctl, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    ctl.send(b"ready")
    while True:
        for fd, _ in poller.poll():
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(status)
                continue
            data, fds, _, _ = socket.recv_fds(ctl, _MAX_MESSAGE, 1)
            if not data:
                return  # the parent is gone
            _, backend, device = data.decode().split()
            status_r, status_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: serve the parent on its socket, never return here
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for own in (ctl.fileno(), wake_r, wake_w, status_r, status_w, *status.values()):
                    with contextlib.suppress(OSError):
                        os.close(own)
                child.main(
                    socket.socket(fileno=fds[0]), backend, None if device == "none" else int(device)
                )
                os._exit(0)  # main() exits itself; in case it returns
            os.close(fds[0])
            status[pid] = status_w
            socket.send_fds(ctl, [f"pid {pid}".encode()], [status_r])
            os.close(status_r)


def _reap(status: dict[int, int]) -> None:
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(wait_status)))
            os.close(fd)


def zygote_main(fd: int) -> None:
    """The zygote process (``python -m torchft_pg.process_group.baby.child zygote FD``)."""
    # Import what every child needs before the first fork: a fork then serves at once.
    import torch  # noqa: F401

    import torchft_pg.process_group.baby.child
    import torchft_pg.process_group.gloo  # noqa: F401

    control = socket.socket(fileno=fd)
    try:
        _serve(control)
    finally:
        control.close()
        os._exit(0)
