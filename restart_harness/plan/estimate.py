"""`./submit-job.sh plan MODEL ... [plan=json] [bandwidth_gbps=X]`: the checkpoint a run would write, and what
saving and restarting it would cost at a given storage bandwidth (docs/planner.md: the storage's bandwidth is an
aggregate shared by all ranks). Launches nothing, writes nothing."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from restart_harness.files import baseline
from restart_harness.plan import checkpoint, universal
from restart_harness.schema import KINDS, MIB
from restart_harness.spec.keys import GB
from restart_harness.spec.runspec import RunSpec

ESTIMATE_IGNORES = ("per-rank and per-client limits (one rank may not reach the aggregate bandwidth), file creation "
                    "and metadata costs, serialization CPU time, the page cache, the commit barrier, and the "
                    "restart's non-I/O phases (imports, process-group and engine initialization, first step)")


def _stats(values: list[int]) -> dict | None:
    return {"max": max(values), "min": min(values), "mean": round(statistics.mean(values), 1)} if values else None


def typical_file_bytes(files: list[checkpoint.PlannedFile]) -> int:
    """The checkpoint's typical file: the median planned file size (what the storage baseline is measured at)."""
    return int(statistics.median(f.bytes for f in files)) if files else 0


def checkpoint_dir(spec: RunSpec) -> str:
    """Where the run's checkpoints would go (a fresh folder is made under it)."""
    return spec.ckpt_dir or str(Path(spec.results_dir).resolve())


def _estimate(plugins, files: list, total: int, read_total: int, bandwidth_gbps: float | None) -> dict:
    spec = plugins.spec
    if bandwidth_gbps is not None:
        write = read = bandwidth_gbps
        source = f"bandwidth_gbps={bandwidth_gbps:g} (GB/s = 10^9 bytes/s, for writing and reading)"
    else:
        found = baseline.cached(plugins.target.storage_probe(), typical_file_bytes(files), spec.world_size)
        if not found or not found.get("write_mib_s") or not found.get("read_mib_s"):
            return {"source": None, "save_seconds": None, "restart_read_seconds": None,
                    "note": "no bandwidth: give bandwidth_gbps=, or measure with ./submit-job.sh baseline "
                            f"dir={checkpoint_dir(spec)}"}
        write, read = found["write_mib_s"] * MIB / GB, found["read_mib_s"] * MIB / GB
        source = (f"cached baseline of {found['dir']} ({found['method']}, {found['ranks']} ranks x "
                  f"{found['file_bytes']} bytes, measured {found['measured_at']})")
    return {
        "source": source, "write_gb_s": round(write, 6), "read_gb_s": round(read, 6),
        "save_seconds": round(total / (write * GB), 6), "restart_read_seconds": round(read_total / (read * GB), 6),
        "definition": "save_seconds = total_bytes / write bandwidth; restart_read_seconds = restart_read_bytes / "
                      "read bandwidth; the bandwidth is an aggregate shared by all ranks",
        "ignores": ESTIMATE_IGNORES}


def build(plugins, bandwidth_gbps: float | None = None, target: RunSpec | None = None) -> dict:
    """The plan as plain data (what plan=json prints) for a run's plug-ins (restart_harness/resolve.py Plugins:
    its spec, engine and storage target); with target, the restart at that layout too."""
    start = time.perf_counter()
    spec, engine = plugins.spec, plugins.engine
    saves = engine.saves
    names = ("predicted" if engine.planned_names else "sizes only") if saves else "none"
    files = checkpoint.stored_files(spec, engine.files()) if saves else []
    reads = checkpoint.stored_reads(spec, engine.files()) if saves else {}
    size_of = {f.path: f.bytes for f in files}
    by_rank = {r: {"files": 0, "bytes": 0} for r in range(spec.world_size)}
    by_kind = {k: {"files": 0, "bytes": 0} for k in KINDS}
    for f in files:
        for row in (by_rank[f.rank], by_kind[f.kind]):
            row["files"] += 1
            row["bytes"] += f.bytes
    read_per_rank = checkpoint.stored_read_bytes(spec, engine.files(), reads, size_of)
    total = sum(f.bytes for f in files)
    read_total = sum(read_per_rank.values())
    note = {
        "predicted": "file names, writing ranks and tensor bytes follow DeepSpeed's rules exactly; each file's pickle "
                     "and zip overhead is estimated (docs/planner.md)",
        "sizes only": f"engine {spec.engine} writes its own layout (e.g. a directory of shards per DeepSpeed file): "
                      "the entries below are DeepSpeed's logical files with their tensor bytes; actual file names "
                      "are not predicted",
        "none": f"engine {spec.engine} writes no checkpoint",
    }[names]
    plan = {
        "model": spec.model_label, "num_parameters": spec.shape.num_parameters(),
        "layout": {"tp": spec.tp, "pp": spec.pp, "dp": spec.dp, "zero": spec.zero, "world_size": spec.world_size},
        "precision": spec.precision, "engine": spec.engine, "names": names, "note": note,
        "files": [{"path": f.path, "bytes": f.bytes, "rank": f.rank, "kind": f.kind, "tensor_bytes": f.tensor_bytes}
                  for f in files],
        "total_files": len(files), "total_bytes": total, "tensor_bytes": sum(f.tensor_bytes for f in files),
        "typical_file_bytes": typical_file_bytes(files), "by_kind": by_kind,
        "bytes_per_rank": _stats([v["bytes"] for v in by_rank.values()]) if files else None,
        "by_rank": {str(r): v for r, v in by_rank.items()}, "restart_read_bytes": read_total,
        "restart_read_bytes_per_rank": _stats(list(read_per_rank.values())),
        "restart_reads": {str(r): paths for r, paths in reads.items()}}
    plan["estimate"] = _estimate(plugins, files, total, read_total, bandwidth_gbps) if files else None
    if target is not None:
        plan["reshard"] = universal.plan(spec, target)
    plan["plan_seconds"] = round(time.perf_counter() - start, 6)
    return plan


def size_text(n: float) -> str:
    for unit, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float) -> str:
    """Seconds as people read them, beside the exact figure: 39367.847 s -> "10.9 h"."""
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * scale:
            return f"{seconds / scale:.1f} {unit}"
    return f"{seconds:.1f} s"


def render(plan: dict, files: bool = False) -> str:
    """The summary (totals, bytes per rank, the estimate, a restart at another layout), then with `files` every file;
    at scale the file list runs to thousands of lines, so it comes last and only when asked for."""
    lay = plan["layout"]
    lines = [(f"plan: {plan['model']} ({plan['num_parameters']:,} parameters), tp={lay['tp']} pp={lay['pp']} "
             f"dp={lay['dp']} zero={lay.get('zero', 1)} ({lay['world_size']} ranks), {plan['precision']}, "
             f"engine {plan['engine']}"),
             f"names: {plan['names']}: {plan['note']}", "", f"total_files        {plan['total_files']}",
             (f"total_bytes        {plan['total_bytes']:,} ({size_text(plan['total_bytes'])}; tensors "
              f"{plan['tensor_bytes']:,})")]
    for kind, v in plan["by_kind"].items():
        if v["files"]:
            lines.append(f"  {kind:<17}{v['files']} files, {v['bytes']:,} bytes")
    per = plan["bytes_per_rank"]
    if per:
        lines.append(f"bytes_per_rank     max {per['max']:,} ({size_text(per['max'])}), min {per['min']:,} "
                     f"({size_text(per['min'])}), mean {per['mean']:,.0f}")
        read = plan["restart_read_bytes_per_rank"]
        lines.append(f"restart_read_bytes {plan['restart_read_bytes']:,} ({size_text(plan['restart_read_bytes'])}); per "
                     f"rank max {read['max']:,}, min {read['min']:,}")
    est = plan["estimate"]
    if est and est["source"]:
        lines += [f"estimate           at {est['source']}",
                  (f"  save_seconds          {est['save_seconds']:.3f} ({duration(est['save_seconds'])})  "
                   f"(total_bytes / {est['write_gb_s']:g} GB/s)"),
                  (f"  restart_read_seconds  {est['restart_read_seconds']:.3f} "
                   f"({duration(est['restart_read_seconds'])})  (restart_read_bytes / {est['read_gb_s']:g} GB/s)"),
                  f"  ignores: {est['ignores']}"]
    elif est:
        lines.append(f"estimate           {est['note']}")
    rs = plan.get("reshard")
    if rs:
        per = rs["restart_read_bytes_per_rank"]
        lines += ["", f"restart at {rs['to']} (from {rs['from']}), through DeepSpeed's universal checkpoint:",
                  (f"  converted          {rs['total_files']} files, {rs['total_bytes']:,} bytes "
                  f"({size_text(rs['total_bytes'])}): zero/<parameter>/{{fp32,exp_avg,exp_avg_sq,step}}.pt at full size, "
                  "optimizer_state.pt, the mp_rank files"),
                  (f"  restart_read_bytes {rs['restart_read_bytes']:,} ({size_text(rs['restart_read_bytes'])}); per rank "
                  f"max {per['max']:,}, min {per['min']:,}")]
    if plan["files"] and files:
        width = max(len(f["path"]) for f in plan["files"])
        lines += ["", f"{'path':<{width}}  {'bytes':>15}  {'rank':>5}  kind"]
        lines += [f"{f['path']:<{width}}  {f['bytes']:>15,}  {f['rank']:>5}  {f['kind']}" for f in plan["files"]]
    elif plan["files"]:
        lines += ["", f"files: {len(plan['files'])} (each with its bytes, writing rank and kind: detail=files)"]
    return "\n".join(lines)
