"""engine=lazy's host buffers: aligned for O_DIRECT, in transparent huge pages where the kernel gives them, page-locked
for CUDA by registering the allocation itself (docs/engines.md#enginelazy)."""

from __future__ import annotations

import ctypes
import functools
import weakref

import torch

ALIGNMENT = 4096
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and most aarch64 kernels
MADV_HUGEPAGE = 14


def aligned(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no numpy, no copy)."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B") if n else memoryview(b"")


def aligned_empty(size: int, pinned: bool = False, zeroed: bool = False) -> torch.Tensor:
    """`size` bytes starting at an ALIGNMENT boundary, with room after them up to a multiple of it (O_DIRECT's rule
    for a request's buffer, offset and length). zeroed: the whole buffer, padding and gaps between tensors included,
    so a file written from it holds no stray bytes of the process's memory. pinned: page-locked for CUDA's copies by
    registering this allocation itself (cudaHostRegister), not through torch's pinned-memory allocator, which rounds
    every block up to a power of two (docs/engines.md#enginelazy) and keeps freed blocks cached."""
    huge = size >= HUGE_PAGE
    raw = torch.empty(aligned(size) + (HUGE_PAGE if huge else ALIGNMENT), dtype=torch.uint8)
    shift = -raw.data_ptr() % (HUGE_PAGE if huge else ALIGNMENT)
    buf = raw[shift:shift + size]
    if huge:  # transparent huge pages over buf's whole 2 MiB pages before anything touches it: its first touch
        # faults 2 MiB pages, not 4 KiB ones (docs/benchmarks.md); where they are off, or madvise fails, nothing changes
        libc().madvise(ctypes.c_void_p(buf.data_ptr()), ctypes.c_size_t(size - size % HUGE_PAGE), MADV_HUGEPAGE)
    if zeroed:
        raw[shift:shift + aligned(size)].zero_()  # the buffer and its padding: its pages, and no others, touched
    if pinned:  # the buffer and its padding page-locked for CUDA, unregistered when raw is collected
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(buf.data_ptr(), aligned(size), 0)
        if int(getattr(err, "value", err)) != 0:
            raise RuntimeError(f"cudaHostRegister of {aligned(size)} bytes failed: CUDA error "
                               f"{int(getattr(err, 'value', err))}")
        weakref.finalize(raw, cudart.cudaHostUnregister, buf.data_ptr())
        buf._rh_registered = raw  # the registration lasts as long as the buffer handed out
    return buf


@functools.cache
def libc():
    return ctypes.CDLL(None, use_errno=True)


def padded_view(buf: torch.Tensor) -> memoryview:
    """A buffer from aligned_empty with its zero padding: whole aligned blocks, as O_DIRECT requests need."""
    n = aligned(buf.numel())
    return memoryview((ctypes.c_ubyte * n).from_address(buf.data_ptr())).cast("B") if n else memoryview(b"")


