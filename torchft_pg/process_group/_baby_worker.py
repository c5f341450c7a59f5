"""The Baby PG's child process: owns the real backend, outlives reconfigurations.

The command loop never blocks on a collective: ops are launched and finish
through their futures (CPU) or a waiter thread (CUDA), so a "configure" is
served even while an op on the old group is stuck. The child exits when the
parent's socket closes (the parent died or shut it down).
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

from torchft_pg.errors import is_timeout
from torchft_pg.process_group import _baby_protocol as proto
from torchft_pg.process_group import _reaper


class _Child:
    def __init__(self, sock: socket.socket, backend: str, device_index: int | None) -> None:
        self._sock = sock
        self._backend = backend
        self._device_index = device_index
        self._send_lock = threading.Lock()
        self._pg: Any = None
        self._lease: Any = None  # the store client lent to the current group
        self._tensors = proto.ChildTensors()

    def reply(self, message: Any) -> None:
        with self._send_lock:
            proto.send(self._sock, message)

    def configure(self, store_addr: str, rank: int, world_size: int, timeout_s: float) -> None:
        from torchft_pg.process_group.gloo import create_gloo_group
        from torchft_pg.process_group.nccl import create_nccl_group
        from torchft_pg.store import lease_store_client

        if self._pg is not None:
            holder, self._pg = [self._pg], None
            with contextlib.suppress(Exception):  # a broken backend may refuse to abort
                holder[0].abort()
            _reaper.retire(holder)
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        timeout = timedelta(seconds=timeout_s)
        lease = lease_store_client(store_addr, timeout)
        create = create_nccl_group if self._backend == "nccl" else create_gloo_group
        try:
            self._pg = create(lease.store, rank, world_size, timeout)
        except BaseException:
            lease.release()
            raise
        self._lease = lease

    def run_op(self, op_id: int, name: str, args: Any, inline: list[bytes], fds: list[int]) -> None:
        decoded, inline_tensors = self._tensors.decode(args, inline, fds)
        if self._pg is None:
            raise RuntimeError("Baby PG child has no configured group")
        work = getattr(self._pg, name)(*decoded)
        uses_cuda = _any_cuda(decoded)

        def finish(error: str | None) -> None:
            results = [] if error else proto.inline_results(inline_tensors)
            source = work._source_rank() if name == "recv_anysource" and not error else None
            self.reply(("done", op_id, error, results, source))

        def wait_in_thread() -> None:
            try:
                work.wait()
                if uses_cuda:
                    torch.cuda.current_stream().synchronize()
                finish(None)
            except Exception as e:
                finish(f"{type(e).__name__}: {e}")

        def on_done(fut: Any) -> None:
            try:
                fut.value()
                finish(None)
            except Exception as e:
                finish(f"{type(e).__name__}: {e}")

        if not uses_cuda:
            try:
                future = work.get_future()
            except RuntimeError:  # e.g. Gloo send/recv works have no future
                future = None
            if future is not None:
                future.add_done_callback(on_done)
                return
        threading.Thread(target=wait_in_thread, daemon=True).start()

    def loop(self) -> None:
        if self._device_index is not None and torch.cuda.is_available():
            torch.cuda.set_device(self._device_index)
        self.reply(("ready", os.getpid()))
        receiver = proto.Receiver(self._sock)
        while True:
            try:
                message, fds = receiver.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "op":
                _, op_id, name, args, inline, forget = message
                self._tensors.forget(forget)
                try:
                    self.run_op(op_id, name, args, inline, fds)
                except Exception as e:
                    self.reply(("done", op_id, f"{type(e).__name__}: {e}", [], None))
            elif kind == "configure":
                _, store_addr, rank, world_size, timeout_s = message
                try:
                    self.configure(store_addr, rank, world_size, timeout_s)
                    self.reply(("configured", None, False))
                except Exception as e:
                    text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
                    self.reply(("configured", text, is_timeout(e)))
            elif kind == "shutdown":
                return


def _any_cuda(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, (list, tuple)):
        return any(_any_cuda(v) for v in value)
    return False


def main(sock: socket.socket, backend: str, device_index: int | None) -> None:
    """Serve the parent on `sock` until it closes (started by `baby._ChildProcess`)."""
    try:
        _Child(sock, backend, device_index).loop()
    finally:
        sock.close()
        os._exit(0)  # skip interpreter teardown: backend threads may still be winding down


if __name__ == "__main__":
    import sys

    fd, backend_name, device = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    main(socket.socket(fileno=fd), backend_name, None if device == "none" else int(device))
