"""The on-disk format of engine=lazy, its reader and its converter to DeepSpeed's own torch.save layout. Needs only
torch (and whatever the state's non-tensor objects need to unpickle, as torch.load of DeepSpeed's own file does).

Every file DeepSpeed asks the engine to write (`.../global_step8/mp_rank_00_model_states.pt`, a ZeRO optimizer
file, a pipeline layer file) becomes a directory of that name:

    header.json      {"format": "restart-harness-lazy", "version": 1, "alignment": 4096,
                      "tensors": [{"dtype": "bfloat16", "shape": [4096, 4096], "part": 0, "offset": 0,
                                   "nbytes": 33554432}, ...],          # in the order the remainder refers to them
                      "parts": [{"file": "part-0.bin", "bytes": 33554432, "writer_dp_rank": 0}, ...],
                      "remainder": "remainder.pkl"}
    remainder.pkl    the state dict pickled (protocol 5) with every tensor replaced by a persistent id ("t", i):
                     i indexes header["tensors"]; everything that is not tensor data (ints, strings, the ds_config,
                     DeepSpeed's slice mappings) is here
    part-<k>.bin     raw tensor bytes, C-contiguous, native byte order; each tensor starts at a multiple of
                     `alignment`; nothing else (no per-tensor headers, no pickling)

A file replicated over data-parallel ranks (the model weights of a pp=1 run) is split into parts written by
different replicas (part k by data-parallel rank k); the header and the remainder are written by replica 0.
A directory is complete when every part has its `bytes`; the harness commits `latest` only after every rank's files
are durable.

    python -m engines._lazy_format to-torch-save CKPT/global_step8 OUT/global_step8
writes the same checkpoint as DeepSpeed's default engine would have (one torch.save file per directory, other files
copied), so DeepSpeed's zero_to_fp32.py, ds_to_universal and a default-engine restart can read it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import io
import json
import os
import pickle
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

FORMAT = "restart-harness-lazy"
VERSION = 1
ALIGNMENT = 4096
HEADER, REMAINDER = "header.json", "remainder.pkl"
READ_CHUNK_BYTES = 16 << 20
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and most aarch64 kernels
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23  # Linux 5.14 and later; EINVAL before


def part_name(k: int) -> str:
    return f"part-{k}.bin"


def is_lazy(path: str | Path) -> bool:
    return (Path(path) / HEADER).is_file()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def aligned(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no numpy, no copy)."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B") if n else memoryview(b"")


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors: list):
        super().__init__(f, protocol=5)
        self.tensors = tensors
        self.index: dict[int, int] = {}  # id(tensor) -> its index: a tensor referred to twice is stored once

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            if id(obj) not in self.index:
                self.index[id(obj)] = len(self.tensors)
                self.tensors.append(obj)
            return ("t", self.index[id(obj)])
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors: list):
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid):
        kind, i = pid
        assert kind == "t", pid
        return self.tensors[i]


def split(state: object) -> tuple[list[torch.Tensor], bytes]:
    """(the state's tensors in pickling order, the remainder pickled with persistent ids in their place)."""
    tensors: list[torch.Tensor] = []
    buf = io.BytesIO()
    _Pickler(buf, tensors).dump(state)
    return tensors, buf.getvalue()


def aligned_empty(size: int, pinned: bool = False, zeroed: bool = False) -> torch.Tensor:
    """`size` bytes starting at an ALIGNMENT boundary, with room after them up to a multiple of it (O_DIRECT's rule
    for a request's buffer, offset and length). zeroed: the whole buffer, padding and gaps between tensors included,
    so a file written from it holds no stray bytes of the process's memory. pinned: page-locked for CUDA's copies by
    registering this allocation itself (cudaHostRegister), not through torch's pinned-memory allocator, which rounds
    every block up to a power of two (a 0.73 GB buffer took 1 GiB) and keeps freed blocks cached."""
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
    anything touches it: a fresh buffer's first touch costs a page fault per page, and on this project's virtual
    machine 4 KiB pages were touched at 1.4 GB/s against 3.5 GB/s in 2 MiB pages (2026-11-27), as slow as the disk
    reads into them. Where huge pages are off (`never`) or madvise fails, nothing changes."""
    start, end = buf.data_ptr(), buf.data_ptr() + buf.numel() - buf.numel() % HUGE_PAGE
    if end > start:
        _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE)


@functools.cache
def _libc():
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


class Reads:
    """One file being read into a buffer by a pool's threads, READ_CHUNK_BYTES a request: wait() for it.

    A fresh buffer's pages are faulted in by a thread of its own ahead of the reads (populate,
    MADV_POPULATE_WRITE), not by each read as it lands: on this project's virtual machine fresh memory is first
    touched at about 1,600 MiB/s, as slow as the disk reads into it, and a request that faults its own pages holds
    its share of the storage idle meanwhile. The thread only helps: a request whose pages it has not begun faults
    them itself, so where CPUs are short it never holds a read back. Two ranks reading their ZeRO files with
    O_DIRECT (medians of 6, interleaved, 2026-11-27): 1,416 MiB/s into fresh buffers (914-1,540), 1,443
    (1,424-1,453) populated ahead, 1,468 into buffers touched beforehand. Where the kernel has no
    MADV_POPULATE_WRITE (before Linux 5.14) each request faults its own."""

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
        libc = _libc()
        for i, event in enumerate(self.ready):
            with self.lock:
                if self.claims[i] is not None:
                    continue
                self.claims[i] = "populating"
            works = False
            try:
                off = i * READ_CHUNK_BYTES
                n = min(READ_CHUNK_BYTES, length - off)
                works = libc.madvise(ctypes.c_void_p(address + off), ctypes.c_size_t(n), MADV_POPULATE_WRITE) == 0
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


def read_into(path: Path, buf: torch.Tensor, pool: ThreadPoolExecutor, direct: bool = False) -> None:
    """The whole file into buf, in large requests issued in parallel. With direct (buf from aligned_empty), O_DIRECT
    requests of whole aligned blocks, the last one ending at the file's end; where the file system refuses O_DIRECT
    (tmpfs), buffered."""
    Reads(path, buf, pool, direct).wait()


def read_header(path: Path) -> dict:
    header = json.loads((path / HEADER).read_text())
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} directory")
    return header


def check_parts(path: Path, header: dict) -> None:
    """Every part file holds its bytes (a stat each: nothing read)."""
    for part in header["parts"]:
        f = path / part["file"]
        if f.stat().st_size < part["bytes"]:
            raise OSError(f"{f}: {f.stat().st_size} bytes, {part['bytes']} expected (a torn checkpoint?)")


def read(path: Path, threads: int = 4, direct: bool = False) -> tuple[dict, bytes, list[torch.Tensor]]:
    """The directory's header, its pickled remainder and every part in a buffer of its own, read here."""
    header = read_header(path)
    check_parts(path, header)
    buffers = [aligned_empty(part["bytes"]) for part in header["parts"]]
    with ThreadPoolExecutor(threads) as pool:  # every part's requests queued at once: `threads` in flight
        reads = [Reads(path / part["file"], buf, pool, direct) for part, buf in zip(header["parts"], buffers,
                                                                                    strict=True)]
        for r in reads:
            r.wait()
    return header, (path / header["remainder"]).read_bytes(), buffers


def load(path: str | Path, threads: int = 4, map_location=None, reuse: dict | None = None, reader=None) -> object:
    """The state dict saved at path: each part read into one buffer, tensors built as views of it. With `reuse`
    (a dict the caller keeps), loading the same path again right after rebuilds the state from the buffers already
    read instead of reading the files again (DeepSpeed's load reads a pp=1 model file twice). `reader`: path ->
    (header, remainder, buffers) instead of read() (engine=lazy's broadcast load)."""
    path = Path(path)
    if reuse is not None and reuse.get("path") == str(path):
        header, remainder, buffers = reuse["read"]
        check_parts(path, header)  # checked on every load, a reused one too
    else:
        header, remainder, buffers = reader(path) if reader else read(path, threads)
        if reuse is not None:
            reuse.update(path=str(path), read=(header, remainder, buffers))
    tensors = []
    for t in header["tensors"]:
        flat = buffers[t["part"]][t["offset"]:t["offset"] + t["nbytes"]]
        tensors.append(flat.view(getattr(torch, t["dtype"])).view(t["shape"]))
    return _Unpickler(io.BytesIO(remainder), _relocate(tensors, map_location)).load()


def _relocate(tensors: list[torch.Tensor], map_location) -> list[torch.Tensor]:
    """torch.load's map_location for tensors read onto the CPU (a device, its name, or DeepSpeed's callable)."""
    if map_location is None or isinstance(map_location, dict):
        return tensors
    if callable(map_location):
        out = []
        for t in tensors:
            storage = map_location(t.untyped_storage(), "cpu")
            out.append(torch.empty(0, dtype=t.dtype, device=storage.device).set_(
                storage, t.storage_offset(), t.size(), t.stride()))
        return out
    return [t.to(map_location) for t in tensors]


def to_torch_save(src: str | Path, dst: str | Path) -> list[Path]:
    """A checkpoint tag directory of engine=lazy -> the same tag as DeepSpeed's default engine writes it."""
    src, dst = Path(src), Path(dst)
    written = []
    for entry in sorted(src.rglob("*")):
        rel = entry.relative_to(src)
        if any(is_lazy(p) for p in [src / q for q in _parents(rel)]):
            continue  # inside a lazy directory: converted with it
        out = dst / rel
        if entry.is_dir() and is_lazy(entry):
            out.parent.mkdir(parents=True, exist_ok=True)
            torch.save(load(entry), out)
            written.append(out)
        elif entry.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry, out)
            written.append(out)
    return written


def _parents(rel: Path) -> list[Path]:
    return [p for p in rel.parents if str(p) != "."]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "to-torch-save":
        print("usage: python -m engines._lazy_format to-torch-save SRC_TAG_DIR DST_TAG_DIR", file=sys.stderr)
        return 2
    src, dst = Path(argv[1]), Path(argv[2])
    if not src.is_dir():
        print(f"error: {src}: no such checkpoint directory", file=sys.stderr)
        return 2
    if dst.exists() and any(dst.iterdir()):
        print(f"error: {dst}: exists and is not empty", file=sys.stderr)
        return 2
    files = to_torch_save(src, dst)
    print(f"{len(files)} files written under {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
