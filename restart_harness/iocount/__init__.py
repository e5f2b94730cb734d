"""Per-process counters of the I/O done on the checkpoint's files and, by source, on every path (rhio.c, loaded with
LD_PRELOAD into each rank, compiled once per machine into the user cache directory; without a C compiler the anatomy
reports no read/write split: docs/anatomy.md). Python reads its own process's counters through ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from restart_harness.files.cache_dir import cache_dir

SOURCE = Path(__file__).with_name("rhio.c")
CLASSES = ("read", "write", "sync")
HIST_BUCKETS = 24  # bucket b: requests of [2^(b+9), 2^(b+10)) bytes; 0 is < 1 KiB, the last >= 4 GiB
PATH_MAX = 4096
ENV_PREFIXES = "RH_IO_PREFIXES"
ENV_SHARED = "RH_IO_SHARED"
ENV_SOURCES = "RH_IO_SOURCES"
# rhio.c's per-source counters, in its RH_S_* order (docs/measurements.md#io-by-source defines each)
SOURCE_COUNTERS = ("opens", "open_failures", "metadata_calls", "metadata_failures", "listings", "reads", "read_bytes",
                   "writes", "write_bytes")
OTHER = "other"  # rhio.c's source 0: a path no prefix matches


def sources_variable(sources: dict[str, list[str]], ancestors: tuple[str, ...] = ()) -> str:
    """RH_IO_SOURCES's value: `name=/a:/b;name2+=/c` (rhio.c parses it; source_table() reads it back). The sources
    named in `ancestors` also take the folders above their prefixes that no prefix matches."""
    for name, prefixes in sources.items():
        bad = [p for p in prefixes if not p.startswith("/") or ":" in p or ";" in p]
        if not name.isidentifier() or bad:
            raise ValueError(f"I/O source {name!r}: prefixes must be absolute paths without ':' or ';': {bad}")
    return ";".join(f"{name}{'+' if name in ancestors else ''}={':'.join(prefixes)}"
                    for name, prefixes in sources.items() if prefixes)


@dataclass(frozen=True)
class SourceTable:
    """An RH_IO_SOURCES value, read back: (prefix, source) pairs longest first, and the sources taking ancestors."""

    prefixes: tuple[tuple[str, str], ...]
    ancestors: frozenset[str]

    @classmethod
    def parse(cls, value: str) -> SourceTable:
        table, ancestors = [], set()
        for item in value.split(";"):
            name, _, prefixes = item.partition("=")
            if name.endswith("+"):
                name = name[:-1]
                ancestors.add(name)
            table += [(p.rstrip("/") or "/", name) for p in prefixes.split(":") if name and p.startswith("/")]
        return cls(tuple(sorted(table, key=lambda e: -len(e[0]))), frozenset(ancestors))

    def __bool__(self) -> bool:
        return bool(self.prefixes)

    def source_of(self, path: str) -> str:
        """The source of an absolute path, as rhio.c decides it: a source taking the folders above its prefixes
        when the path is one, else the longest prefix matching whole components, else `other`."""
        folder = path.rstrip("/") or "/"
        for prefix, name in self.prefixes:
            if name in self.ancestors and prefix != folder and (folder == "/" or prefix.startswith(folder + "/")):
                return name
        for prefix, name in self.prefixes:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return name
        return OTHER


class _Totals(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64 * 3), ("bytes", ctypes.c_uint64 * 3), ("ns", ctypes.c_uint64 * 3),
                ("busy_ns", ctypes.c_uint64 * 3), ("opens", ctypes.c_uint64), ("files", ctypes.c_uint64)]


class _File(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char * PATH_MAX), ("opens", ctypes.c_uint64), ("calls", ctypes.c_uint64 * 3),
                ("bytes", ctypes.c_uint64 * 3), ("ns", ctypes.c_uint64 * 3),
                ("hist", (ctypes.c_uint64 * HIST_BUCKETS) * 2)]


def bucket_label(b: int) -> str:
    """Request sizes counted in bucket b, e.g. `4M-8M`."""
    def size(n: int) -> str:  # n: 1 KiB or more
        unit, scale = next((u, s) for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)) if n >= s)
        return f"{n // scale}{unit}"

    if b == 0:
        return "<1K"
    return f">={size(1 << (b + 9))}" if b == HIST_BUCKETS - 1 else f"{size(1 << (b + 9))}-{size(1 << (b + 10))}"


def build() -> Path | None:
    """The compiled library (compiling it first if needed), or None where no C compiler is available."""
    # this machine's build, named by the source's hash: an edit rebuilds it
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = cache_dir("iocount") / f"librhio-{platform.machine()}-{digest}.so"
    if target.is_file():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".librhio-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-Wall", "-o", tmp, str(SOURCE), "-ldl",
                               "-lpthread"], capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise OSError(f"{compiler} failed on {SOURCE}: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: concurrent builders leave one whole library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class Counters:
    """This process's counters, when rhio is preloaded into it (else `available` is False)."""

    def __init__(self):
        self._lib = lib = ctypes.CDLL(None)
        self.available = hasattr(lib, "rh_io_version")
        if self.available:
            lib.rh_io_totals.argtypes = [ctypes.POINTER(_Totals)]
            lib.rh_io_file.argtypes = [ctypes.c_int, ctypes.POINTER(_File)]
            lib.rh_io_add_prefix.argtypes = [ctypes.c_char_p]
        # version 2 counts by source; a library built from an older rhio.c (a stale cache) does not
        self.sources_available = self.available and hasattr(lib, "rh_io_source")
        if self.sources_available:
            lib.rh_io_source_name.restype = ctypes.c_char_p
            lib.rh_io_source.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]

    def add_prefix(self, path: Path) -> None:
        if self.available:
            self._lib.rh_io_add_prefix(str(Path(path).resolve()).encode())

    def totals(self) -> dict | None:
        """Per class (read, write, sync): calls, bytes, seconds summed over calls, and wall seconds during which
        at least one call of the class was in flight (busy); opens and distinct files."""
        if not self.available:
            return None
        t = _Totals()
        self._lib.rh_io_totals(ctypes.byref(t))
        out = {c: {"calls": t.calls[i], "bytes": t.bytes[i], "seconds": t.ns[i] / 1e9, "busy_seconds": t.busy_ns[i] / 1e9}
               for i, c in enumerate(CLASSES)}
        return {**out, "opens": t.opens, "files": t.files}

    def sources(self) -> dict[str, dict[str, int]] | None:
        """Per source (RH_IO_SOURCES's names, `other` first): SOURCE_COUNTERS since the process started."""
        if not self.sources_available:
            return None
        out, values = {}, (ctypes.c_uint64 * len(SOURCE_COUNTERS))()
        for i in range(self._lib.rh_io_nsources()):
            if self._lib.rh_io_source(i, values) != len(SOURCE_COUNTERS):
                continue
            out[self._lib.rh_io_source_name(i).decode()] = dict(zip(SOURCE_COUNTERS, values, strict=True))
        return out

    def files(self) -> dict[str, dict]:
        """path -> per class calls, bytes, seconds, and the read and write request-size histograms."""
        if not self.available:
            return {}
        out, f = {}, _File()
        for i in range(self._lib.rh_io_nfiles()):
            if self._lib.rh_io_file(i, ctypes.byref(f)) != 0:
                continue
            record = {c: {"calls": f.calls[k], "bytes": f.bytes[k], "seconds": f.ns[k] / 1e9,  # sizes: read, write
                          **({"sizes": list(f.hist[k])} if k < 2 else {})} for k, c in enumerate(CLASSES)}
            out[f.path.decode()] = {**record, "opens": f.opens}
        return out


def _minus(now, then):
    """now - then, key by key of now (counts, histograms of request sizes, dicts of them); then None: now."""
    if isinstance(now, dict):
        return {k: _minus(v, then[k] if then else None) for k, v in now.items()}
    if isinstance(now, list):
        return [a - b for a, b in zip(now, then, strict=True)] if then else now
    return now - then if then else now


def delta(after: dict | None, before: dict | None) -> dict | None:
    """totals() difference (after - before), class by class."""
    return None if after is None or before is None else _minus(after, before)


def file_delta(after: dict[str, dict], before: dict[str, dict]) -> dict[str, dict]:
    """files() difference, keeping only files with I/O in between."""
    out = {path: _minus(rec, before.get(path)) for path, rec in after.items()}
    return {path: d for path, d in out.items() if d["opens"] or any(d[c]["calls"] for c in CLASSES)}


def read_shared(path: Path) -> dict | None:
    """The totals a process tree added to an RH_IO_SHARED file: per class calls, bytes, seconds; opens."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    if len(raw) < 10 * 8:
        return None
    values = struct.unpack("<10Q", raw[:80])  # calls, bytes, ns per class; opens
    out = {c: {"calls": values[i], "bytes": values[3 + i], "seconds": values[6 + i] / 1e9}
           for i, c in enumerate(CLASSES)}
    return {**out, "opens": values[9]}
