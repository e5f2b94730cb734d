"""MLPerf Storage v2.0's checkpoint metrics (Submission_guidelines.md 2.2.3) from harness runs' summaries: how each is
read from the harness's figures, docs/mlperf.md."""

from __future__ import annotations

import statistics

from restart_harness.results.summary import median
from restart_harness.results.views import SummaryView
from restart_harness.schema import GIB


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 6) if values else None


def run_metrics(summary: dict) -> dict:
    """One harness run (its saves and restarts) as one MLPerf run."""
    s = SummaryView.of(summary)
    saves = s.checkpoint.saves if s.checkpoint else ()
    writes = [{"tag": save.tag, "bytes": save.bytes, "duration_seconds": round(seconds, 6),
               "throughput_gib_s": round(save.bytes / GIB / seconds, 6)} for save in saves
              if (seconds := max((r["durable_seconds"] for r in save.per_rank or []), default=None))]
    restarts = [r for r in s.restarts if r.verified]
    reads = [{"record": r.record, "tag": r.tag, "bytes": r.load_bytes, "duration_seconds": round(r.load_seconds, 6),
              "cache": (r.cache or {}).get("observed"), "throughput_gib_s": round(r.load_bytes / GIB / r.load_seconds, 6)}
             for r in restarts if r.load_seconds and r.load_bytes]
    return {
        "run_id": s.run_id, "state": (s.status or {}).get("state"), "writes": writes, "reads": reads,
        "save_duration_seconds": _mean([w["duration_seconds"] for w in writes]),
        "save_throughput_gib_s": _mean([w["throughput_gib_s"] for w in writes]),
        "load_duration_seconds": _mean([r["duration_seconds"] for r in reads]),
        "load_throughput_gib_s": _mean([r["throughput_gib_s"] for r in reads]),
        "harness": {
            "save_blocking_seconds_median": median([x.blocking_seconds for x in saves]),
            "save_durable_seconds_median": median([x.durable_seconds for x in saves]),
            "save_commit_seconds_median": median([x.commit_seconds for x in saves]),
            "restart_total_seconds_median": median([r.total_seconds for r in restarts]),
            "restart_launch_seconds_median": median([r.launch_seconds for r in restarts]),
            "cache_observed": sorted({(r.cache or {}).get("observed") for r in restarts} - {None})}}


METRICS = ("save_duration_seconds", "save_throughput_gib_s", "load_duration_seconds", "load_throughput_gib_s")


def overall(runs: list[dict]) -> dict:
    """MLPerf's final figures: each metric's mean over the runs that have it (and their spread, min and max)."""
    out = {}
    for name in METRICS:
        values = [r[name] for r in runs if r.get(name) is not None]
        out[name] = _mean(values)
        out[f"{name}_min"] = round(min(values), 6) if values else None
        out[f"{name}_max"] = round(max(values), 6) if values else None
    out["runs"] = sum(1 for r in runs if r.get("save_duration_seconds") is not None)
    return out
