"""A rank's I/O by source, phase by phase (rhio.c's counters, /proc/self/maps, /proc/self/io);
docs/measurements.md#io-by-source defines every figure."""

from __future__ import annotations

import contextlib
import os
import resource

from restart_harness import iocount

_KERNEL_FILE = {"read_bytes": "storage_read_bytes", "write_bytes": "storage_write_bytes", "rchar": "read_chars",
                "syscr": "read_syscalls"}


def _kernel(pid: str = "self") -> dict[str, int]:
    """The kernel's figures of this process, or of the forking process (`pid`: a forked rank's own start at zero)."""
    out: dict[str, int] = {}
    # a kernel without task I/O accounting: absent figures, not zero
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in _KERNEL_FILE:
                    out[_KERNEL_FILE[key]] = int(value)
        if pid != "self":
            with open(f"/proc/{pid}/stat") as f:
                out["major_faults"] = int(f.read().rsplit(")", 1)[1].split()[9])  # field 12, majflt
    if pid == "self":
        out["major_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    return out


def _mapped() -> dict[str, int]:
    """File-backed mappings of this process: path -> bytes mapped."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or parts[4] == "0" or not parts[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].rstrip("\n").removesuffix(" (deleted)")
            out[path] = out.get(path, 0) + end - start
    return out


class IOProbe:
    """phase(): the `io` field of a mark, the difference since the previous call (since exec for the first). A rank
    forked from a process that imported for it (launcher=prefork: `forked`) starts from what it inherits; the rank that
    `owns` the forking process's figures (local rank 0) adds them to its first phase: the node's import counts once."""

    def __init__(self, forked: bool = False, owns: bool = False):
        self.counters = iocount.Counters()
        self.table = iocount.SourceTable.parse(os.environ.get(iocount.ENV_SOURCES, ""))
        self.by_source = self.counters.sources_available and bool(self.table)
        inherited = forked and self.by_source
        self._sources: dict[str, dict[str, int]] = (self.counters.sources() if inherited else None) or {}
        self._mapped: dict[str, int] = _mapped() if inherited else {}
        self._kernel: dict[str, int] = {}
        self._carried: dict | None = ({"sources": self._sources, "mapped": self._mapped,
                                        "kernel": _kernel(str(os.getppid()))} if forked and owns else None)

    def phase(self) -> dict:
        kernel, sources = _kernel(), self.counters.sources() if self.by_source else None
        out: dict = {"kernel": {k: v - self._kernel.get(k, 0) for k, v in kernel.items()}}
        self._kernel = kernel
        # the forking process's own I/O from its exec, read from /proc/<parent>/ when the probe started (first phase)
        carried, self._carried = self._carried or {"sources": {}, "mapped": {}, "kernel": {}}, None
        for k, v in carried["kernel"].items():
            out["kernel"][k] = out["kernel"].get(k, 0) + v
        if sources is not None:
            per: dict[str, dict[str, int]] = {}
            for name, counts in sources.items():
                before, extra = self._sources.get(name, {}), carried["sources"].get(name, {})
                per[name] = {k: v - before.get(k, 0) + extra.get(k, 0) for k, v in counts.items()}
            self._sources = sources
            mapped = _mapped()
            new = {path: size for path, size in mapped.items() if path not in self._mapped} | carried["mapped"]
            for path, size in new.items():
                entry = per.setdefault(self.table.source_of(path), dict.fromkeys(iocount.SOURCE_COUNTERS, 0))
                entry["mapped_files"] = entry.get("mapped_files", 0) + 1
                entry["mapped_bytes"] = entry.get("mapped_bytes", 0) + size
            self._mapped = mapped
            out["sources"] = {name: {k: v for k, v in counts.items() if v}
                              for name, counts in per.items() if any(counts.values())}
        return {"io": out}
