"""Storage baseline and ceiling (docs/measurements.md; the cache: docs/planner.md): a target's StorageProbe probes;
this module times, caches (per storage, size and rank count, per checkout unless RH_BASELINE_CACHE=shared) and
renders. Imports nothing above files/: a probe is passed in."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from restart_harness import SOURCE_ROOT
from restart_harness.files.atomic import write_json_atomic
from restart_harness.files.cache_dir import cache_dir

MIB = 1 << 20
BLOCK_BYTES = 4 * MIB
TOOLS = ("auto", "fio", "builtin")
# The automatic probe before a run: bounded so it costs about a second, never minutes; a large checkpoint's probe
# writes a sixteenth of it, up to 2 GiB (small probes swing: docs/planner.md)
AUTO_MIN_FILE_BYTES = 16 * MIB  # fio reports whole milliseconds: smaller files would round to noise
AUTO_MAX_TOTAL_BYTES = 128 * MIB
AUTO_CHECKPOINT_SHARE = 16  # a large checkpoint's probe writes at most 1/16 of it
AUTO_LARGE_TOTAL_BYTES = 2 << 30
AUTO_MAX_RANKS = 8
AUTO_MAX_FREE_FRACTION = 0.1
DEFAULT_FILE_BYTES = 64 * MIB
# the ceiling's shape: a request's bytes and the requests in flight a rank (an engine's defaults may take it)
CEILING_REQUEST_BYTES = 16 * MIB
CEILING_QUEUE_DEPTH = 4
# what a cached record holds (1 the ceiling, 2 its buffered read too, 3 the direct probe in huge pages): an entry of
# another version is measured again
RECORD_VERSION = 3


SCOPE_ENV = "RH_BASELINE_CACHE"
SCOPES = ("checkout", "shared")


def scope() -> str:
    """`checkout` (the default: this checkout's own baselines) or `shared` (RH_BASELINE_CACHE=shared); preflight
    refuses another value (scope_problem)."""
    return "shared" if os.environ.get(SCOPE_ENV) == "shared" else "checkout"


def scope_problem() -> str | None:
    given = os.environ.get(SCOPE_ENV)
    return None if given in (None, "", *SCOPES) else f"{SCOPE_ENV}={given}: accepted: {', '.join(SCOPES)}"


def scope_words(record: dict | None = None) -> str:
    """How a baseline's cache is shared, for the lines that use it."""
    shared = (record or {}).get("cache_scope", scope()) == "shared"
    return "shared by every checkout (RH_BASELINE_CACHE=shared)" if shared else "this checkout's own"


def cache_root() -> Path:
    if scope() == "shared":
        return cache_dir("baseline")
    return cache_dir("baseline", "checkout-" + hashlib.sha256(str(SOURCE_ROOT).encode()).hexdigest()[:12])


def cache_path(probe, file_bytes: int, ranks: int) -> Path:
    return cache_root() / probe.key() / f"{file_bytes}x{ranks}.json"


def cached(probe, file_bytes: int | None = None, ranks: int | None = None) -> dict | None:
    """The cached baseline of the probe's storage: the exact size and rank count if given and present, else the
    most recent measurement there (its file_bytes and ranks say what it was measured at)."""
    folder = cache_root() / probe.key()
    if file_bytes is not None and ranks is not None and (exact := folder / f"{file_bytes}x{ranks}.json").is_file():
        return _read(exact)
    entries = [e for e in (_read(p) for p in folder.glob("*.json")) if e]
    return max(entries, key=lambda e: e.get("measured_at", ""), default=None)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a damaged cache entry is measured again, never trusted


def threads(count: int, work) -> list[float]:
    """Run work(i) in `count` threads released together; each one's seconds from the common start."""
    barrier = threading.Barrier(count + 1)
    ends: list[float] = [0.0] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [e - start for e in ends]


def phase(total: int, seconds: list[float]) -> dict:
    """A write or read phase: bytes, the slowest worker's seconds, MiB/s over them."""
    slowest = max(seconds)
    return {"bytes": total, "seconds": round(slowest, 6), "mib_s": round(total / MIB / slowest, 3) if slowest else None}


PROBE_REPEATS = 3  # probes per baseline: the median is the baseline, min and max its spread


def scratch_name() -> str:
    """A probe's own folder (or prefix), unique per host, process and moment."""
    return f".rh-baseline-{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}"


def _medians(probes: list[dict]) -> tuple[dict, dict, dict]:
    """The median probe's write and read, and the spread over the probes."""
    writes = sorted(probes, key=lambda p: p["write"]["mib_s"])
    reads = sorted(probes, key=lambda p: p["read"]["mib_s"])
    spread = {"repeats": len(probes), "write_mib_s": [writes[0]["write"]["mib_s"], writes[-1]["write"]["mib_s"]],
              "read_mib_s": [reads[0]["read"]["mib_s"], reads[-1]["read"]["mib_s"]]}
    return writes[len(writes) // 2]["write"], reads[len(reads) // 2]["read"], spread


def ceiling(record: dict, direct_probes: list[dict]) -> dict | None:
    """The storage's limit as far as it was measured: per direction the better of the baseline's median and the
    direct probes' median, with where it came from and that probe's spread; None where the storage has no other way
    to be written than the baseline's (object storage: the baseline is the engines' own client)."""
    if not direct_probes:
        return None
    write, read, spread = _medians(direct_probes)
    last = direct_probes[-1]
    direct = {"write_mib_s": write["mib_s"], "read_mib_s": read["mib_s"], "write": write, "read": read,
              "spread": spread, **{k: last.get(k) for k in ("method", "request_bytes", "queue_depth", "o_direct",
                                                             "refused", "write_means", "read_means")},
              "read_cache_observed": (last.get("read_cache") or {}).get("observed")}
    buffered = sorted(p["read_buffered"]["mib_s"] for p in direct_probes
                      if (p.get("read_buffered") or {}).get("mib_s") is not None)
    if buffered:  # the same shape read through the page cache (probes measured before 2026-11-27 have none)
        direct["buffered_read_mib_s"] = buffered[len(buffered) // 2]
        direct["buffered_read_spread"] = [buffered[0], buffered[-1]]
        direct["buffered_read_means"] = last.get("read_buffered_means")
    grid = _grid(direct_probes)
    if grid is not None or last.get("grid_refused"):
        direct["grid"], direct["grid_refused"] = grid, last.get("grid_refused")
    out: dict = {"spread": {"repeats": spread["repeats"]}}
    for way in ("write", "read"):
        # (figure, where from, its spread): the best of fio's grid, the ceiling probe's and the baseline's (for
        # reads, also the probe's buffered read); a tie goes to the earlier
        candidates = [(g[f"{way}_mib_s"], "fio", g[f"{way}_spread"]) for g in grid or ()]
        candidates.append((direct[f"{way}_mib_s"], "direct", spread[f"{way}_mib_s"]))
        if way == "read" and buffered:
            candidates.append((direct["buffered_read_mib_s"], "buffered", direct["buffered_read_spread"]))
        candidates.append((record[f"{way}_mib_s"], "baseline", record["spread"][f"{way}_mib_s"]))
        known = [c for c in candidates if c[0] is not None]
        best = max(known, key=lambda c: c[0], default=(None, "baseline", record["spread"][f"{way}_mib_s"]))
        out[f"{way}_mib_s"], out[f"{way}_from"], out["spread"][f"{way}_mib_s"] = best
    out["direct"] = direct
    return out


def _grid(direct_probes: list[dict]) -> list[dict] | None:
    """fio's grid over the probes (targets/_fs_probe.py fio_grid): each shape's median write and read and their
    min-max; None where no probe ran it."""
    runs = [p["grid"] for p in direct_probes if p.get("grid")]
    if not runs:
        return None
    out = []
    for rows in zip(*runs, strict=True):
        row = {k: rows[0][k] for k in ("request_bytes", "queue_depth", "jobs_per_rank")}
        for way in ("write", "read"):
            values = sorted(r[f"{way}_mib_s"] for r in rows)
            row[f"{way}_mib_s"], row[f"{way}_spread"] = values[len(values) // 2], [values[0], values[-1]]
        out.append(row)
    return out


def measure(probe, file_bytes: int, ranks: int, tool: str = "auto", repeats: int | None = None) -> dict:
    """Probe the storage now, `repeats` times (probe.measure(), then probe.measure_ceiling(): interleaved, so the
    disk's drift reaches both alike); the record (the median write and read, their spread over the repeats, and the
    ceiling()) is cached and returned."""
    started = time.perf_counter()
    probes, directs = [], []
    for _ in range(repeats or PROBE_REPEATS):
        probes.append(probe.measure(file_bytes, ranks, tool))
        if (direct := probe.measure_ceiling(file_bytes, ranks, tool)) is not None:
            directs.append(direct)
    write, read, spread = _medians(probes)
    facts = {k: v for k, v in probes[-1].items() if k not in ("write", "read", "metadata")}
    metas = [p["metadata"] for p in probes if p.get("metadata")]
    if metas:  # each rate the median over the probes (caches written before 2026-11-26 have none)
        facts["metadata"] = {k: sorted(m[k] for m in metas)[len(metas) // 2] if k.endswith("_per_s") else metas[0][k]
                             for k in metas[0]}
    record = {
        "write_mib_s": write["mib_s"], "read_mib_s": read["mib_s"], **facts, "file_bytes": file_bytes, "ranks": ranks,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "write": write, "read": read, "spread": spread, "record_version": RECORD_VERSION, "cache_scope": scope()}
    record["ceiling"] = ceiling(record, directs)
    record["probe_seconds"] = round(time.perf_counter() - started, 3)
    path = cache_path(probe, file_bytes, ranks)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return record


def auto_size(typical_file_bytes: int, ranks: int, free_bytes: int, checkpoint_bytes: int = 0) -> tuple[int, int] | None:
    """(file_bytes, ranks) for the automatic probe: the checkpoint's typical file and rank count, bounded (AUTO_*);
    None when the file system has too little free space to probe at all."""
    ranks = max(1, min(ranks, AUTO_MAX_RANKS))
    total = max(AUTO_MAX_TOTAL_BYTES, min(checkpoint_bytes // AUTO_CHECKPOINT_SHARE, AUTO_LARGE_TOTAL_BYTES))
    budget = min(total, int(free_bytes * AUTO_MAX_FREE_FRACTION))
    file_bytes = min(max(typical_file_bytes, AUTO_MIN_FILE_BYTES), budget // ranks)
    file_bytes -= file_bytes % 4096
    return (file_bytes, ranks) if file_bytes >= AUTO_MIN_FILE_BYTES else None


def age_seconds(record: dict) -> float | None:
    """Seconds since the record was measured (None when it says no time)."""
    try:
        return max(0.0, (datetime.now(timezone.utc) - datetime.fromisoformat(record["measured_at"])).total_seconds())
    except (KeyError, TypeError, ValueError):
        return None


def bandwidths_mib_s(record: dict | None) -> tuple[float | None, float | None, str]:
    """(write, read) the prediction's storage terms take from a baseline record, MiB/s, and which they are: the
    ceiling's where it was measured (the storage's best: docs/prediction.md), else the baseline's."""
    record = record or {}
    best = record.get("ceiling") or {}
    if best.get("write_mib_s") and best.get("read_mib_s"):
        return best["write_mib_s"], best["read_mib_s"], "ceiling"
    return record.get("write_mib_s"), record.get("read_mib_s"), "baseline"


def summary_record(record: dict | None, cached_flag: bool) -> dict | None:
    """The summary.json `baseline` object: the measurement, and how old it was when the run used it."""
    if record is None:
        return None
    keys = ("write_mib_s", "read_mib_s", "method", "file_bytes", "ranks", "dir", "measured_at", "spread", "ceiling",
            "cache_scope")
    age = age_seconds(record)
    return {**{k: record.get(k) for k in keys}, "cached": cached_flag,
            "age_seconds": round(age, 1) if age is not None else None,
            "read_cache_observed": (record.get("read_cache") or {}).get("observed"),
            **({"error": record["error"]} if record.get("error") else {})}


def for_run(probe, typical_file_bytes: int, ranks: int, max_age_seconds: float | None = None,
            checkpoint_bytes: int = 0) -> dict:
    """The baseline a run records: the cached one for this storage, size and rank count when at most max_age_seconds
    old, else a bounded measurement now; a probe that cannot run is recorded with its error, never fails the run."""
    try:
        free = probe.free_bytes()
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "dir": probe.describe(), "cached": False}
    size = auto_size(typical_file_bytes, ranks, AUTO_LARGE_TOTAL_BYTES / AUTO_MAX_FREE_FRACTION if free is None else free,
                     checkpoint_bytes)
    if size is None:
        return {"error": "too little free space for a probe", "dir": probe.describe(), "cached": False}
    file_bytes, ranks = size
    hit = cached(probe, file_bytes, ranks)
    fresh = hit and (max_age_seconds is None or (age_seconds(hit) or float("inf")) <= max_age_seconds)
    # an entry cached by an older probe (without the ceiling, or without its buffered read) is measured again
    if fresh and hit.get("file_bytes") == file_bytes and hit.get("ranks") == ranks \
            and hit.get("record_version") == RECORD_VERSION:
        return summary_record(hit, True)
    try:
        return summary_record(measure(probe, file_bytes, ranks), False)
    except Exception as exc:  # noqa: BLE001 - includes the S3 client's errors; recorded, never fatal
        return {"error": f"{type(exc).__name__}: {exc}", "dir": probe.describe(), "cached": False}


def _spread(record: dict, key: str) -> str:
    """"median of 3, 250.1 to 330.9": what the probes spanned."""
    sp = record.get("spread")
    return f"median of {sp['repeats']}, {sp[key][0]} to {sp[key][1]}" if sp else "one probe"


def render(record: dict, cached_at: Path) -> str:
    cache, fs, m = record["read_cache"], record["filesystem"], record.get("metadata")
    where = fs.get("where") or f"{fs['type']} on {fs['device']}, mounted at {fs['mount']}"
    return "\n".join([
        f"storage baseline of {record['dir']} ({where})",
        (f"  method        {record['method']}, {record['ranks']} ranks x {record['file_bytes']} bytes, "
         f"{record['block_bytes']} byte blocks"),
        (f"  write_mib_s   {record['write_mib_s']}  ({record['write_means']}; slowest rank "
         f"{record['write']['seconds']} s; {_spread(record, 'write_mib_s')})"),
        (f"  read_mib_s    {record['read_mib_s']}  ({record['read_means']}; {_spread(record, 'read_mib_s')}; page cache "
         f"before the read: {cache['observed']}" + (f", {cache['error']}" if cache.get("error") else "") + ")"),
        *([(f"  metadata      create {m['create_per_s']:,.0f}, stat {m['stat_per_s']:,.0f}, open "
            f"{m['open_per_s']:,.0f}, remove {m['remove_per_s']:,.0f} operations/s ({m['ranks']} ranks x "
            f"{m['files_per_rank']} files, mdtest's shape; median of the probes)")] if m else []),
        *_ceiling_lines(record.get("ceiling")),
        f"  measured_at   {record['measured_at']}; cached in {cached_at} ({scope_words(record)})"])


def _ceiling_lines(c: dict | None) -> list[str]:
    """The ceiling's two lines (and how the direct probe was made) for the `baseline` command."""
    if not c:
        return []
    d = c["direct"]
    how = (f"{d['method']}, {'O_DIRECT' if d['o_direct'] else 'buffered (' + str(d['refused']) + ')'}, "
           f"{d['request_bytes'] // MIB} MiB requests, {d['queue_depth']} in flight a rank")
    out = []
    for way in ("write", "read"):
        src = {"fio": "fio's best shape, O_DIRECT", "direct": "the direct probe", "buffered": "the probe's shape read buffered, faster than O_DIRECT",
               "baseline": "the baseline, faster than the direct probe"}[c[f"{way}_from"]]
        lo, hi = c["spread"][f"{way}_mib_s"]
        buffered = f"; buffered {d['buffered_read_mib_s']}" if way == "read" and d.get("buffered_read_mib_s") else ""
        out.append(f"  ceiling_{way}_mib_s  {c[f'{way}_mib_s']}  ({src}; median of {c['spread']['repeats']}, {lo} to {hi};"
                   f" direct probe {d[f'{way}_mib_s']}{buffered})")
    grid = "; ".join(f"{g['request_bytes'] // MIB} MiB x {g['queue_depth']} x {g['jobs_per_rank']} job(s): write "
                     f"{g['write_mib_s']}, read {g['read_mib_s']}" for g in d.get("grid") or ())
    fio = [f"  ceiling_fio   {grid or d.get('grid_refused')} (MiB/s; request x in flight a job x jobs a rank)"]
    return [*out, f"  ceiling_method  {how}", *(fio if "grid_refused" in d else [])]
