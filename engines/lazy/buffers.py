"""engine=lazy's host buffers: aligned for O_DIRECT, in transparent huge pages where the kernel gives them, page-locked
for CUDA by registering the allocation itself (docs/engines.md#enginelazy)."""

from __future__ import annotations

import ctypes
import functools

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
    if huge:
        _huge_pages(buf)
    if zeroed:
        raw[shift:shift + aligned(size)].zero_()  # the buffer and its padding: its pages, and no others, touched
    if pinned:
        _register(raw, buf.data_ptr(), aligned(size))
        buf._rh_registered = raw  # the registration lasts as long as the buffer handed out
    return buf


def _huge_pages(buf: torch.Tensor) -> None:
    """Ask for transparent huge pages (MADV_HUGEPAGE) over the whole 2 MiB pages of buf, none past its end, before
    anything touches it: a fresh buffer's first touch then faults 2 MiB pages, not 4 KiB ones (docs/benchmarks.md:
    several times faster). Where huge pages are off (`never`) or madvise fails, nothing changes."""
    start, end = buf.data_ptr(), buf.data_ptr() + buf.numel() - buf.numel() % HUGE_PAGE
    if end > start:
        libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE)


@functools.cache
def libc():
    return ctypes.CDLL(None, use_errno=True)


def _register(raw: torch.Tensor, ptr: int, n: int) -> None:
    """Page-lock n bytes at ptr (a buffer of raw's, its padding included, nothing else of raw) for CUDA;
    unregistered when raw is collected."""
    import weakref

    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(ptr, n, 0)
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"cudaHostRegister of {n} bytes failed: CUDA error {int(getattr(err, 'value', err))}")
    weakref.finalize(raw, cudart.cudaHostUnregister, ptr)


def padded_view(buf: torch.Tensor) -> memoryview:
    """A buffer from aligned_empty with its zero padding: whole aligned blocks, as O_DIRECT requests need."""
    n = aligned(buf.numel())
    return memoryview((ctypes.c_ubyte * n).from_address(buf.data_ptr())).cast("B") if n else memoryview(b"")


