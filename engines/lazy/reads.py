"""engine=lazy's parallel reads: one file read into a buffer by a pool's threads, a request at a time, its fresh pages
faulted in ahead of the reads by a thread of its own."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engines.lazy.buffers import byte_view, libc, padded_view

READ_CHUNK_BYTES = 16 << 20
MADV_POPULATE_WRITE = 23  # Linux 5.14 and later; EINVAL before


class Reads:
    """One file being read into a buffer by a pool's threads, READ_CHUNK_BYTES a request: wait() for it.

    A thread of its own faults in the fresh buffer's pages ahead of the reads (MADV_POPULATE_WRITE, Linux 5.14 and
    later); a request whose pages it has not begun faults them itself, so it never holds a read back
    (docs/engines.md#enginelazy)."""

    def __init__(self, path: Path, buf: torch.Tensor, pool: ThreadPoolExecutor, direct: bool = False,
                 populate: bool = True):
        self.path, self.size = path, buf.numel()
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
        offsets = range(0, len(self.view), READ_CHUNK_BYTES)
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
        lib = libc()
        for i, event in enumerate(self.ready):
            with self.lock:
                if self.claims[i] is not None:
                    continue
                self.claims[i] = "populating"
            works = False
            try:
                off = i * READ_CHUNK_BYTES
                n = min(READ_CHUNK_BYTES, length - off)
                works = lib.madvise(ctypes.c_void_p(address + off), ctypes.c_size_t(n), MADV_POPULATE_WRITE) == 0
                self.populated += works  # counted before the read it releases can finish
            finally:
                event.set()
            if not works:
                return

    def _chunk(self, off: int) -> None:
        if self.claims:
            i = off // READ_CHUNK_BYTES
            with self.lock:
                populating = self.claims[i] == "populating"
                self.claims[i] = "read"
            if populating:
                self.ready[i].wait()
        end = min(off + READ_CHUNK_BYTES, len(self.view))
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


