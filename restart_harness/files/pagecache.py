"""Evict checkpoint files from the page cache before a restart and read back their residency with mincore(2); the
same for the Python environment and the extension cache (`env_cache=`: environment())."""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import socket
import sys
from pathlib import Path

from restart_harness.files.atomic import files_under

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


def not_applicable(requested: str, why: str, observed: str | None = "not applicable", method: str | None = None
                   ) -> dict:
    """The cache step's record where nothing was observed: no local page cache holds the checkpoint (object storage),
    or the step left the pages as they were."""
    return {"requested": requested, "method": method, "error": None, "bytes": None, "resident_bytes_before": None,
            "resident_bytes_after": None, "observed": observed, "why": why}


def _evict(files: list[Path], record: dict, per_file: bool) -> None:
    """drop_caches (every clean page, dentry and inode: a node just booted) where allowed and not `per_file`, else
    posix_fadvise(DONTNEED) on each file; the method and errors go in record."""
    if not per_file:
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            record["method"] = "drop_caches"
            return
        except OSError as exc:
            record["error"] = f"drop_caches: {exc.strerror or exc}"
    try:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        record["method"] = "posix_fadvise_dontneed"
    except OSError as exc2:
        record["error"] = "; ".join(filter(None, (record["error"], f"posix_fadvise: {exc2.strerror or exc2}")))


def _observed(after: int, total: int, margin: float = 0.0) -> str:
    """cold, warm or partial; within `margin` (a share of the bytes) of either end is cold or warm."""
    share = after / total if total else 0.0
    return "cold" if share <= margin else "warm" if share >= 1 - margin else f"partial ({share:.1%} resident)"


def prepare(files: list[Path], requested: str, per_file: bool = False, libraries: list[Path] | None = None) -> dict:
    """Make the cache state `requested` (drop | warm) for files; report what was tried and observed. `per_file`:
    evict these files only, never the whole cache (env_cache=warm keeps the environment's pages). `libraries`
    (environment()): observed on these instead, and warm reads every file."""
    seen = files if libraries is None else libraries
    total = sum(f.stat().st_size for f in seen)
    counts = {} if libraries is None else {"files": len(files), "libraries": len(libraries)}
    record = {"requested": requested, "method": None, "error": None, **counts, "bytes": total,
              "resident_bytes_before": resident_total(seen)}
    if requested == "drop":
        _evict(files, record, per_file)
    elif libraries is not None:
        buf = bytearray(4 << 20)
        for path in files:
            with contextlib.suppress(OSError), open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        record["method"] = "read"
    after = resident_total(seen)
    return {**record, "resident_bytes_after": after,
            "observed": _observed(after, total, 0.0 if libraries is None else ENVIRONMENT_MARGIN)}


def _files(prefixes: list[str]) -> list[Path]:
    """Every regular file under the prefixes (folders; a prefix that is a file is itself), each once."""
    seen: set[str] = set()
    out: list[Path] = []
    for prefix in prefixes:
        walk = [(prefix, [], [])] if os.path.isfile(prefix) else os.walk(prefix)
        for folder, _, names in walk:
            for name in names or [""]:
                path = os.path.realpath(os.path.join(folder, name)) if name else os.path.realpath(folder)
                if path not in seen and os.path.isfile(path):
                    seen.add(path)
                    out.append(Path(path))
    return out


# other processes of the machine keep resident what they map, and a page or two of a file may come and go
ENVIRONMENT_MARGIN = 0.01


def environment(prefixes: list[str], requested: str, checkpoint: dict, per_file: bool = False) -> dict:
    """The page-cache step of the Python environment and the extension cache (env_cache=): drop evicts their files
    (drop_caches unless `per_file`), warm reads them all, keep and auto say what the checkpoint's step (`checkpoint`:
    its record) did to them. Observed with mincore on their shared libraries (most of their bytes)."""
    if requested == "keep":
        return not_applicable("keep", "env_cache=keep: not observed; the environment's pages were left as they were "
                              "(the checkpoint's were evicted file by file)", None)
    if requested == "auto":
        evicted = checkpoint.get("method") == "drop_caches"
        return not_applicable("auto", "env_cache=auto: not observed; " + (
            "cache=drop's drop_caches evicted every clean page, the environment's too" if evicted
            else "the environment's pages were left as they were"), None,
            "drop_caches (the checkpoint's cache step)" if evicted else None)
    files = _files(prefixes)
    return prepare(files, requested, per_file, [f for f in files if f.name.endswith(".so") or ".so." in f.name])


def main(argv: list[str] | None = None) -> int:
    """`python -m restart_harness.files.pagecache drop|warm DIR [--per-file]`: the cache step on this node (a multi-node
    job's every node), its record one JSON line with the host name; --per-file: DIR's files alone, never drop_caches."""
    args = argv if argv is not None else sys.argv[1:]
    requested, where = args[:2]
    record = prepare(files_under(Path(where)), requested, per_file="--per-file" in args[2:])
    print(json.dumps({"host": socket.gethostname(), **record}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
