"""Evict checkpoint files from the page cache before a restart, and check what actually happened by
reading back page residency with mincore(2)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(path: Path) -> int:
    """Bytes of path that are in the page cache now (mincore over a read-only mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            resident = sum(1 for v in vec if v & 1)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(size, resident * PAGE)


def resident_total(files: list[Path]) -> int:
    return sum(resident_bytes(f) for f in files)


def _drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _fadvise_dontneed(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def not_applicable(requested: str, why: str) -> dict:
    """The cache step's record where no local page cache holds the checkpoint (object storage)."""
    return {"requested": requested, "method": None, "error": None, "bytes": None, "resident_bytes_before": None,
            "resident_bytes_after": None, "observed": "not applicable", "why": why}


def prepare(files: list[Path], requested: str) -> dict:
    """Make the cache state `requested` (drop | warm) for files; report what was tried and observed."""
    total = sum(f.stat().st_size for f in files)
    before = resident_total(files)
    record = {"requested": requested, "method": None, "error": None, "bytes": total,
              "resident_bytes_before": before}
    if requested == "drop":
        try:
            _drop_caches()
            record["method"] = "drop_caches"
        except OSError as exc:
            record["error"] = f"drop_caches: {exc.strerror or exc}"
            try:
                _fadvise_dontneed(files)
                record["method"] = "posix_fadvise_dontneed"
            except OSError as exc2:
                record["error"] += f"; posix_fadvise: {exc2.strerror or exc2}"
    after = resident_total(files)
    record["resident_bytes_after"] = after
    if after == 0:
        record["observed"] = "cold"
    elif after >= total:
        record["observed"] = "warm"
    else:
        record["observed"] = f"partial ({after / total:.1%} resident)"
    return record


def main(argv: list[str] | None = None) -> int:
    """`python -m restart_harness.storage.pagecache drop|warm DIR`: the cache step on this node, its record as one
    JSON line with the node's host name (a multi-node job runs it on every node: launch/runner.py)."""
    import json
    import socket
    import sys

    from restart_harness.storage.atomic import files_under

    requested, where = (argv if argv is not None else sys.argv[1:])[:2]
    print(json.dumps({"host": socket.gethostname(), **prepare(files_under(Path(where)), requested)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
