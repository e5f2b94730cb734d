"""The anatomy of loads and saves (the slowest rank's seconds per category, every rank's beside it), and memory per
phase, from the ranks' events into summary.json. Definitions: restart_harness/worker/anatomy.py and docs/anatomy.md."""

from __future__ import annotations

import statistics

from restart_harness import iocount
from restart_harness.schema import LOAD_CATEGORIES, SAVE_CATEGORIES


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _io_summary(io: dict | None, classes: tuple[str, ...], stream: dict | None = None) -> dict:
    """Bytes, calls and busy seconds per I/O class from the counters; bytes also those of a target's network streams
    (object storage, which the counters cannot see)."""
    out = {}
    for cls in classes:
        part, over_network = (io or {}).get(cls) or {}, (stream or {}).get(cls)
        out[f"{cls}_bytes"] = (part.get("bytes") or 0) + over_network if over_network else part.get("bytes")
        out[f"{cls}_calls"] = part.get("calls")
        out[f"{cls}_busy_seconds"] = _round(part.get("busy_seconds"))
    return out


def _files(per_rank: dict[int, dict], cls: str, root: str | None) -> list[dict]:
    """Per file and rank: bytes, calls, seconds inside the calls, request sizes (for one I/O class); paths relative
    to the checkpoint root."""
    out = []
    prefix = root.rstrip("/") + "/" if root else ""
    for rank, record in sorted(per_rank.items()):
        for path, f in sorted((record.get("files") or {}).items()):
            part = f[cls]
            if not part["calls"]:
                continue
            out.append({"path": path.removeprefix(prefix), "rank": rank, f"{cls}_bytes": part["bytes"], f"{cls}_calls": part["calls"],
                        f"{cls}_seconds": _round(part["seconds"]),
                        "request_sizes": {iocount.bucket_label(b): n for b, n in enumerate(part["sizes"]) if n}})
    return out


def _breakdown(per_rank: dict[int, dict], categories: tuple[str, ...], io_classes: tuple[str, ...],
               measured: dict[int, float] | None = None) -> dict:
    """Slowest rank's categories, every rank's, and their agreement with the measured figure per rank."""
    ranks = []
    for rank, record in sorted(per_rank.items()):
        seconds = record["seconds"]
        row = {"rank": rank, **{f"{c}_seconds": seconds.get(c) for c in categories},
               "window_seconds": record["window_seconds"],
               **_io_summary(record.get("io"), io_classes, record.get("stream"))}
        if measured is not None and rank in measured:
            row["measured_seconds"] = _round(measured[rank])
        ranks.append(row)
    slowest = max(ranks, key=lambda r: r["window_seconds"])
    sums = [sum(r[f"{c}_seconds"] or 0.0 for c in categories) for r in ranks]
    return {"slowest_rank": slowest["rank"], **{f"{c}_seconds": slowest[f"{c}_seconds"] for c in categories},
            "window_seconds": slowest["window_seconds"], "method": next(iter(per_rank.values())).get("method"),
            "sum_of_categories_seconds": _round(sums[ranks.index(slowest)]), "per_rank": ranks}


def load(record: dict[int, list[dict]], checkpoint_load: dict[int, float], root: str | None = None) -> dict | None:
    """restart.load_breakdown from each rank's `load_anatomy` event; checkpoint_load: rank -> that phase's
    seconds from the marks, which the categories must add up to."""
    per_rank = {rank: e for rank, evs in record.items() for e in evs if e["event"] == "load_anatomy"}
    if not per_rank:
        return None
    out = _breakdown(per_rank, LOAD_CATEGORIES, ("read",), checkpoint_load)
    out["storage_read"] = storage_read(out["per_rank"])
    out["files"] = _files(per_rank, "read", root)
    out["intervals"] = {rank: e.get("intervals", []) for rank, e in sorted(per_rank.items())}
    out["starts"] = {rank: e["start"] for rank, e in sorted(per_rank.items())}
    return out


def storage_read(ranks: list[dict]) -> dict | None:
    """The storage side of a load: every byte the ranks read over the slowest rank's wall time with a read in flight
    on any of its threads (its `read` category where no busy time was counted): docs/measurements.md (the storage
    side)."""
    def seconds_of(r: dict) -> float | None:
        return r.get("read_busy_seconds") or r.get("read_seconds")

    if not ranks or any(r.get("read_bytes") is None or not seconds_of(r) for r in ranks):
        return None
    nbytes, slowest = sum(r["read_bytes"] for r in ranks), max(ranks, key=seconds_of)
    seconds = seconds_of(slowest)
    return {"bytes": nbytes, "seconds": seconds, "throughput_mib_s": round(nbytes / (1 << 20) / seconds, 3),
            "slowest_rank": slowest["rank"],
            "seconds_basis": "read busy (a read in flight on any thread)" if slowest.get("read_busy_seconds")
            else "read category (no busy time counted)"}


def save(per_rank_saves: list[dict], root: str | None = None) -> dict | None:
    """saves[].breakdown from each rank's save event of one tag (its `anatomy` of the blocking or whole save)."""
    per_rank = {s["rank"]: s["anatomy"] for s in per_rank_saves if s.get("anatomy")}
    if not per_rank:
        return None
    out = _breakdown(per_rank, SAVE_CATEGORIES, ("write", "sync"))
    out["files"] = _files(per_rank, "write", root)
    flushes = [s["flush"] for s in per_rank_saves if s.get("flush")]
    if flushes:  # async: the part after save_checkpoint returned, in the background
        out["flush"] = {"seconds_max": max(f["seconds"] for f in flushes),
                        "write_busy_seconds_max": max((f["write_busy_seconds"] or 0.0) for f in flushes),
                        "fsync_busy_seconds_max": max((f["fsync_busy_seconds"] or 0.0) for f in flushes)}
    return out


def memory(record: dict[int, list[dict]], phases: tuple) -> dict | None:
    """Per phase, the largest host RSS high-water mark over ranks (and device memory on CUDA), with the rank."""
    out: dict[str, dict] = {}
    for name, start_mark, end_mark in phases:
        rss, device = [], []
        for rank, evs in sorted(record.items()):
            names = {e["name"] for e in evs if e["event"] == "mark"}
            if start_mark not in names:  # a phase this record does not have (an emulated restart trains nothing)
                continue
            mark = next((e for e in evs if e["event"] == "mark" and e["name"] == end_mark), None)
            if mark and mark.get("peak_rss_bytes") is not None:
                rss.append((mark["peak_rss_bytes"], rank))
            if mark and mark.get("peak_device_bytes") is not None:
                device.append((mark["peak_device_bytes"], rank))
        if rss:
            top, rank = max(rss)
            out[name] = {"peak_rss_bytes_max": top, "rank": rank,
                         "peak_rss_bytes_median": int(statistics.median(v for v, _ in rss))}
            if device:
                out[name]["peak_device_bytes_max"] = max(device)[0]
    return out or None


def stragglers(per_rank_phases: list[dict], names: tuple[str, ...]) -> dict:
    """Per phase: the slowest rank and its excess over the median rank (seconds)."""
    out = {}
    for name in names:
        values = [(r["phases"][name], r["rank"]) for r in per_rank_phases if name in r["phases"]]
        if not values:
            continue
        top, rank = max(values)
        median = statistics.median(v for v, _ in values)
        out[name] = {"rank": rank, "seconds": round(top, 6), "excess_over_median_seconds": round(top - median, 6)}
    return out
