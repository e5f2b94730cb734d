"""dftracer traces (trace=true) -> per phase I/O summaries in summary.json (docs/anatomy.md): each event given to the
rank whose process wrote it and to that rank's phase whose window holds the event's start; the raw traces stay in
traces/<record>/."""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter, defaultdict
from pathlib import Path

from restart_harness import iocount

READS = {"read", "pread", "pread64", "readv", "preadv", "preadv2", "fread"}
WRITES = {"write", "pwrite", "pwrite64", "writev", "pwritev", "pwritev2", "fwrite"}
SYNCS = {"fsync", "fdatasync", "sync_file_range", "msync"}
OPENS = {"open", "open64", "openat", "openat64", "creat", "creat64", "fopen", "fopen64"}


def _records(folder: Path):
    """Every JSON record of every trace file in folder (a torn tail of a killed process is skipped)."""
    for path in sorted(folder.glob("*.pfw*")):
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        except (OSError, EOFError, zlib.error):  # a writer killed before it finished: what can be decompressed
            try:
                raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(path.read_bytes())
            except zlib.error:
                raw = b""
        for line in raw.decode(errors="replace").splitlines():
            line = line.strip().rstrip(",")
            if not line.startswith("{"):
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_events(folder: Path) -> list[dict]:
    """Every event on a file, of every trace file in folder, with the file's path as `file` where the trace names
    it (dftracer writes each path once, as an `FH` record mapping its hash to the name)."""
    names, out = {}, []
    for e in _records(folder):
        args = e.get("args") or {}
        if e.get("name") == "FH" and args.get("value"):
            names[args["value"]] = args.get("name")
        # calls on files only (dftracer also records process calls: exec, fork, waitpid)
        elif e.get("cat") in ("POSIX", "STDIO") and "ts" in e and args.get("fhash"):
            out.append(e)
    for e in out:
        e["file"] = names.get(e["args"]["fhash"])
    return out


def _empty() -> dict:
    return {"operations": Counter(), "read_bytes": 0, "write_bytes": 0, "io_seconds": 0.0, "files": set(),
            "metadata_operations": 0, "sizes": Counter()}


def _add(acc: dict, e: dict) -> None:
    name, args = e["name"], e.get("args") or {}
    acc["operations"][name] += 1
    acc["io_seconds"] += e.get("dur", 0) / 1e6
    size = args.get("ret")  # bytes the call moved: the histogram, like the anatomy's, is of completed sizes
    way = "read" if name in READS else "write" if name in WRITES else None
    if way and isinstance(size, int) and size >= 0:
        acc[f"{way}_bytes"] += size
        # iocount's buckets: < 1 KiB, then powers of two
        acc["sizes"][(way, min((size >> 10).bit_length(), iocount.HIST_BUCKETS - 1))] += 1
    elif not way and name not in SYNCS:
        acc["metadata_operations"] += 1
    if name in OPENS and args.get("fhash"):
        acc["files"].add(args["fhash"])


def _render(acc: dict) -> dict:
    sizes: dict[str, dict[str, int]] = {"read": {}, "write": {}}
    for (cls, b), n in sorted(acc["sizes"].items()):
        sizes[cls][iocount.bucket_label(b)] = n
    return {"operations": dict(sorted(acc["operations"].items())), "read_bytes": acc["read_bytes"],
            "write_bytes": acc["write_bytes"], "io_seconds": round(acc["io_seconds"], 6),
            "files_opened": len(acc["files"]), "metadata_operations": acc["metadata_operations"],
            "request_sizes": sizes}


def summarize(folder: Path, record: dict[int, list[dict]], phases: list[tuple[str, str, str]]) -> dict | None:
    """Per phase (over ranks) and per rank: the I/O the trace shows. `phases`: (name, start mark, end mark); each
    save of the record is a phase of its own ("save <tag>", its start to its commit) and takes precedence."""
    if not folder.is_dir():
        return None
    pid_rank = {e["pid"]: rank for rank, evs in record.items() for e in evs if e["event"] == "process"}
    windows: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    for rank, evs in record.items():
        marks = {e["name"]: e["t"] for e in evs if e["event"] == "mark"}
        windows[rank] += [(f"save {e['tag']}", e["start"], e["start"] + e["commit_seconds"]) for e in evs
                          if e["event"] == "save"]
        windows[rank] += [(name, marks[a], marks[b]) for name, a, b in phases if a in marks and b in marks]
    by_phase, by_rank, unplaced = defaultdict(_empty), defaultdict(_empty), _empty()
    events = read_events(folder)
    for e in events:
        rank = pid_rank.get(e.get("pid"))
        t = e["ts"] / 1e6
        phase = next((n for n, a, b in windows.get(rank, []) if a <= t <= b), None) if rank is not None else None
        _add(by_phase[phase] if phase else unplaced, e)
        if rank is not None:
            _add(by_rank[rank], e)
    order = [n for n, _, _ in phases]
    return {
        "tool": "dftracer", "events": len(events), "raw": str(folder),
        "phases": {name: _render(acc) for name, acc in sorted(
            by_phase.items(), key=lambda kv: (kv[0] not in order, order.index(kv[0]) if kv[0] in order else 0, kv[0]))},
        "outside_phases": _render(unplaced),
        "per_rank": {str(rank): _render(acc) for rank, acc in sorted(by_rank.items())}}
