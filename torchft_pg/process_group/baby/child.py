"""The Baby PG's child process: owns the real backend, outlives reconfigurations.

The command loop never blocks on a collective: ops are launched and finish
through their futures (CPU) or a waiter thread (CUDA), so a `Configure` is
served even while an op on the old group is stuck. A finished op's reply is
sent by whichever thread completes it (a SOCK_SEQPACKET send is atomic, so
no lock). The child exits when the parent's socket closes (the parent died
or shut it down).

Started as ``python -m torchft_pg.process_group.baby.child FD BACKEND DEVICE``,
or forked by a zygote (``... baby.child zygote FD``, see `zygote`);
it imports only what a backend needs (torch, the process-group modules).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import traceback
from datetime import timedelta
from typing import Any

import torch

from torchft_pg import _torch_internals
from torchft_pg.errors import is_timeout
from torchft_pg.process_group import _reaper
from torchft_pg.process_group._staging import backend_op
from torchft_pg.process_group.baby import messages as msgs
from torchft_pg.process_group.baby import protocol as proto
from torchft_pg.store import BorrowedStore, StoreAddress, borrow_store_client

_RECV_ANYSOURCE = "recv_anysource"


class _Child:
    def __init__(self, sock: socket.socket, backend: str, device_index: int | None) -> None:
        self._sock = sock
        self._backend = backend
        self._device_index = device_index
        self._pg: Any = None
        self._borrowed_store: BorrowedStore | None = (
            None  # the store client lent to the current group
        )
        self._tensors = proto.ChildTensors()

    def configure(
        self,
        address: StoreAddress,
        rank: int,
        world_size: int,
        timeout_s: float,
        hostname: str | None = None,
    ) -> None:
        """Replace the backend with one for `address`; `timeout_s` bounds its rendezvous.
        `hostname`: the address a Gloo backend binds and advertises (None: torch's)."""
        if self._pg is not None:
            holder, self._pg = [self._pg], None
            with contextlib.suppress(Exception):  # a broken backend may refuse to abort
                holder[0].abort()
            _reaper.retire(holder)
        if self._borrowed_store is not None:
            self._borrowed_store.release()
            self._borrowed_store = None
        timeout = timedelta(seconds=timeout_s)
        borrowed = borrow_store_client(address, timeout)
        try:
            if self._backend == "nccl":
                from torchft_pg.process_group.nccl import create_nccl_group

                self._pg = create_nccl_group(borrowed.store, rank, world_size, timeout)
            else:
                from torchft_pg.process_group.gloo import create_gloo_group

                self._pg = create_gloo_group(borrowed.store, rank, world_size, timeout, hostname)
        except BaseException:
            borrowed.release()
            raise
        self._borrowed_store = borrowed

    def run_op(self, message: msgs.RunOp, payload: memoryview, fds: list[int]) -> None:
        """Launch the op; its reply is sent when it completes (see `_Reply`)."""
        self._tensors.forget(message.forget)
        args, inline, uses_cuda = self._tensors.decode(message.args, payload, fds)
        if self._pg is None:
            raise RuntimeError("Baby PG child has no configured group")
        work = backend_op(self._pg, message.name)(*args)
        reply = _Reply(self._sock, message.op_id, inline, work, message.name == _RECV_ANYSOURCE)
        if not uses_cuda:
            try:
                future = work.get_future()
            except RuntimeError:  # e.g. Gloo send/recv works have no future
                future = None
            if future is not None:
                future.add_done_callback(reply.on_future)
                return
        threading.Thread(target=reply.wait_and_send, args=(uses_cuda,), daemon=True).start()

    def loop(self) -> None:
        if self._device_index is not None and torch.cuda.is_available():
            torch.cuda.set_device(self._device_index)
        msgs.send(self._sock, msgs.Ready(request_id=0, pid=os.getpid()))
        receiver = msgs.Receiver(self._sock)
        while True:
            try:
                message, payload, fds = receiver.recv()
            except (EOFError, OSError):
                return
            if type(message) is msgs.RunOp:
                try:
                    self.run_op(message, payload, fds)
                except Exception as e:
                    _send_done(self._sock, message.op_id, f"{type(e).__name__}: {e}", [], None)
            elif isinstance(message, msgs.Configure):
                try:
                    self.configure(
                        message.address,
                        message.rank,
                        message.world_size,
                        message.timeout_s,
                        message.hostname,
                    )
                    reply = msgs.Configured(
                        request_id=message.request_id, error=None, timed_out=False
                    )
                except Exception as e:
                    text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
                    reply = msgs.Configured(
                        request_id=message.request_id, error=text, timed_out=is_timeout(e)
                    )
                msgs.send(self._sock, reply)
            elif isinstance(message, msgs.Shutdown):
                return


class _Reply:
    """Sends one op's `OpDone` when its work completes (on the completing thread)."""

    __slots__ = ("_inline", "_op_id", "_sock", "_want_source", "_work")

    def __init__(
        self,
        sock: socket.socket,
        op_id: int,
        inline: list[Any],
        work: Any,
        want_source: bool,
    ) -> None:
        self._sock = sock
        self._op_id = op_id
        self._inline = inline  # the memory of the op's inline tensors (their results)
        self._work = work
        self._want_source = want_source

    def on_future(self, future: Any) -> None:
        try:
            future.value()
        except Exception as e:
            self._send(f"{type(e).__name__}: {e}")
            return
        self._send(None)

    def wait_and_send(self, uses_cuda: bool) -> None:
        try:
            self._work.wait()
            if uses_cuda:
                torch.cuda.current_stream().synchronize()
        except Exception as e:
            self._send(f"{type(e).__name__}: {e}")
            return
        self._send(None)

    def _send(self, error: str | None) -> None:
        source = None
        if error is None and self._want_source:
            source = _torch_internals.source_rank(self._work)
        results = proto.result_buffers(self._inline) if error is None else []
        _send_done(self._sock, self._op_id, error, results, source)


def _send_done(
    sock: socket.socket, op_id: int, error: str | None, results: list[Any], source: int | None
) -> None:
    with contextlib.suppress(OSError):  # the parent is gone: the loop sees EOF and exits
        msgs.send(sock, msgs.OpDone(op_id=op_id, error=error, source_rank=source), results)


def main(sock: socket.socket, backend: str, device_index: int | None) -> None:
    """Serve the parent on `sock` until it closes (started by `parent.ChildProcess`)."""
    try:
        _Child(sock, backend, device_index).loop()
    finally:
        sock.close()
        os._exit(0)  # skip interpreter teardown: backend threads may still be winding down


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "zygote":  # forks children instead (see zygote)
        from torchft_pg.process_group.baby.zygote import zygote_main

        zygote_main(int(sys.argv[2]))
    fd, backend_name, device = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    main(socket.socket(fileno=fd), backend_name, None if device == "none" else int(device))
