"""engine=lazy's host buffers: aligned for O_DIRECT, in transparent huge pages where the kernel gives them and they pay,
page-locked for CUDA by registering the allocation itself; and its parallel reads into them, a request at a time,
fresh pages faulted in ahead of the reads by a thread of their own (docs/engines.md#enginelazy)."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ALIGNMENT = 4096
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and most aarch64 kernels
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
LIBC = ctypes.CDLL(None, use_errno=True)


def aligned(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def byte_view(t: torch.Tensor, n: int | None = None) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes, or its first n (no numpy, no copy)."""
    n = t.numel() * t.element_size() if n is None else n
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B") if n else memoryview(b"")


def aligned_empty(size: int, pinned: bool = False, zeroed: bool = False, huge_pages: bool | None = None) -> torch.Tensor:
    """`size` bytes starting at an ALIGNMENT boundary, with room after them up to a multiple of it (O_DIRECT's rule);
    zeroed: padding included; pinned: registered with cudaHostRegister; huge_pages: True, in transparent huge pages (a
    save's staging; a load's where policy.load_pages says: docs/engines.md#enginelazy); False, in 4 KiB pages even
    where the allocator hands back memory an earlier buffer had flagged for huge pages (half of the time in a test);
    None: as the allocator gives it."""
    huge = huge_pages and size >= HUGE_PAGE
    raw = torch.empty(aligned(size) + (HUGE_PAGE if huge else ALIGNMENT), dtype=torch.uint8)
    shift = -raw.data_ptr() % (HUGE_PAGE if huge else ALIGNMENT)
    buf = raw[shift:shift + size]
    if huge_pages is not None and size >= HUGE_PAGE:  # before anything touches buf; where transparent huge pages
        # are off, or madvise fails, nothing changes
        LIBC.madvise(ctypes.c_void_p(buf.data_ptr()), ctypes.c_size_t(size - size % HUGE_PAGE),
                     MADV_HUGEPAGE if huge else MADV_NOHUGEPAGE)
    if zeroed:
        raw[shift:shift + aligned(size)].zero_()  # the buffer and its padding: its pages, and no others, touched
    if pinned:  # the buffer and its padding page-locked for CUDA, unregistered when raw is collected
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(buf.data_ptr(), aligned(size), 0)
        if (code := int(getattr(err, "value", err))) != 0:
            raise RuntimeError(f"cudaHostRegister of {aligned(size)} bytes failed: CUDA error {code}")
        weakref.finalize(raw, cudart.cudaHostUnregister, buf.data_ptr())
        buf._rh_registered = raw  # the registration lasts as long as the buffer handed out
    return buf


def padded_view(buf: torch.Tensor) -> memoryview:
    """A buffer from aligned_empty with its zero padding: whole aligned blocks, as O_DIRECT requests need."""
    return byte_view(buf, aligned(buf.numel()))


READ_CHUNK_BYTES = 16 << 20  # a request's bytes where the engine's read_chunk_mib does not say
MADV_POPULATE_WRITE = 23  # Linux 5.14 and later; EINVAL before


class Reads:
    """One file being read into a buffer by a pool's threads, `chunk` bytes a request (a multiple of ALIGNMENT), its
    pages faulted in ahead by a thread of its own (docs/engines.md#enginelazy): wait() for it."""

    def __init__(self, path: Path, buf: torch.Tensor, pool: ThreadPoolExecutor, direct: bool = False,
                 populate: bool = True, chunk: int = READ_CHUNK_BYTES):
        self.path, self.size, self.chunk = path, buf.numel(), chunk
        self.fd, self.view = None, padded_view(buf) if direct else byte_view(buf)
        if direct:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        if self.fd is None:  # buffered, or O_DIRECT refused by the file system (tmpfs before Linux 6.6)
            self.view = byte_view(buf)
            self.fd = os.open(path, os.O_RDONLY)
        self.buffered_fd = None
        offsets = range(0, len(self.view), chunk)
        # per request: None (untouched), "populating" (the thread is at it: ready[i] is set when done) or "read"
        self.claims: list | None = [None] * len(offsets) if populate and len(offsets) > 1 else None
        self.ready = [threading.Event() for _ in offsets] if self.claims else None
        self.lock = threading.Lock()
        self.requests, self.populated = len(offsets), 0  # requests; those whose pages the thread faulted in
        if self.claims:
            threading.Thread(target=self._populate, args=(buf.data_ptr(), len(self.view)), daemon=True,
                             name="rh-lazy-populate").start()
        self.futures = [pool.submit(self._chunk, off) for off in offsets]

    def _populate(self, address: int, length: int) -> None:
        """Fault in the pages of every request no read has begun, in order."""
        for i, event in enumerate(self.ready):
            with self.lock:
                if self.claims[i] is not None:
                    continue
                self.claims[i] = "populating"
            works = False
            try:
                off = i * self.chunk
                n = min(self.chunk, length - off)
                works = LIBC.madvise(ctypes.c_void_p(address + off), ctypes.c_size_t(n), MADV_POPULATE_WRITE) == 0
                self.populated += works  # counted before the read it releases can finish
            finally:
                event.set()
            if not works:
                return

    def _chunk(self, off: int) -> None:
        if self.claims:
            i = off // self.chunk
            with self.lock:
                populating = self.claims[i] == "populating"
                self.claims[i] = "read"
            if populating:
                self.ready[i].wait()
        end = min(off + self.chunk, len(self.view))
        fd = self.fd
        while off < min(end, self.size):
            try:
                n = os.preadv(fd, [self.view[off:end]], off)
            except OSError as exc:  # a file system that takes the O_DIRECT open and refuses the request
                if exc.errno != errno.EINVAL or fd == self.buffered_fd:
                    raise
                if self.buffered_fd is None:
                    self.buffered_fd = os.open(self.path, os.O_RDONLY)
                fd = self.buffered_fd
                continue
            if n <= 0:
                raise OSError(f"{self.path}: short read at byte {off} of {self.size} (a torn checkpoint?)")
            off += n

    def wait(self) -> None:
        """Every request done (all of them, even after one failed: none may still use the file), then closed."""
        errors = [f.exception() for f in self.futures]
        for fd in (self.fd, self.buffered_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.buffered_fd = None
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
