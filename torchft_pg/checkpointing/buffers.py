"""Receive buffers whose pages are made ready alongside the transfer, not inside it.

Receiving into a fresh `torch.empty` buffer pays one page fault per 4 KiB page
inside the socket read. On the 2-core dev VM first touch alone ran at
~1.7-1.9 GB/s (0.22 s for 400 MB), slower than loopback TCP (~5 GB/s), and it
serialised with the copy. Large CPU buffers are therefore anonymous mappings
that a helper thread populates (``MADV_POPULATE_WRITE``, Linux >= 5.14, ~0.16 s
per 400 MB there, GIL released) in the order the bytes will arrive, while the
receiving thread copies into the pages already populated. Where the call is not
available the pages simply fault in on first write, as with `torch.empty`.

Transparent huge pages (``MADV_HUGEPAGE``) were tried and left out: on that VM,
memory the guest had not touched before took 0.38-0.49 s per 400 MB to populate
with huge pages (0.04 s only when reusing freed memory), worse than 4 KiB pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import threading
from collections.abc import Callable, Sequence

import torch

__all__ = ["MAPPED_THRESHOLD_BYTES", "Prefaulter", "alloc_bytes"]

#: CPU buffers at least this large (bytes) are anonymous mappings.
MAPPED_THRESHOLD_BYTES = 2 << 20
_MADV_POPULATE_WRITE = 23  # linux/mman.h; not exported by Python 3.11's mmap module
_STEP_BYTES = 8 << 20  # populate this much per call, so the receiver can overtake


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_madvise = _libc_madvise()


def alloc_bytes(nbytes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A 1-D uint8 tensor of `nbytes` on `device`; contents unspecified.

    Large CPU buffers come from an anonymous mapping (page aligned, so
    `Prefaulter` can populate it); the tensor keeps the mapping alive.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    dev = torch.device(device)
    if dev.type != "cpu" or nbytes < MAPPED_THRESHOLD_BYTES:
        return torch.empty(nbytes, dtype=torch.uint8, device=dev)
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError):
        return torch.empty(nbytes, dtype=torch.uint8)
    return torch.frombuffer(m, dtype=torch.uint8)


class Prefaulter:
    """Populate the pages of `buffers` in order on a helper thread.

    Purely an optimisation: the receiver may write anywhere at any time (an
    unpopulated page just faults in). `stop()` ends it early and joins it; each
    step is one bounded `madvise` call of at most 8 MiB.
    """

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        self._todo = [
            (b.data_ptr(), b.numel())
            for b in buffers
            if b.device.type == "cpu"
            and b.numel() >= MAPPED_THRESHOLD_BYTES
            and b.data_ptr() % mmap.PAGESIZE == 0
        ]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if _madvise is not None and self._todo:
            self._thread = threading.Thread(target=self._run, name="ckpt-prefault", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert _madvise is not None
        for addr, size in self._todo:
            for off in range(0, size, _STEP_BYTES):
                if self._stop.is_set():
                    return
                if _madvise(addr + off, min(_STEP_BYTES, size - off), _MADV_POPULATE_WRITE) != 0:
                    return  # not supported (old kernel): first writes fault pages in

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
