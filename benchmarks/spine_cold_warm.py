#!/usr/bin/env python3
"""End-to-end wall time of `./submit-job.sh tiny` (checkpoint + restart), cold and warm, and the 8-rank layout.

Method
- cold: DeepSpeed's JIT-built op cache (<user cache>/torch_extensions/<environment>) is moved aside first, so the run pays the
  deepspeed_shm_comm build, as a first run on a fresh machine does (the Python environment is already installed).
- warm: the cache is in place (a second run).
- 8 ranks: `./submit-job.sh tiny tp=2 pp=2 dp=2`, warm; peak resident memory per rank from summary.json
  (each rank's ru_maxrss).
- Each case runs REPEATS times in sequence on an otherwise idle machine; wall seconds of the whole command
  (time.perf_counter around the subprocess) are reported as median, min and max.

Usage: .venv/bin/python -m benchmarks.spine_cold_warm [REPEATS]   (prints a Markdown table)
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from benchmarks.common import scratch, submitted, summary, table, words
from restart_harness.files.cache_dir import extensions_dir

CACHE = extensions_dir()


def timed(args: list[str], results: Path) -> tuple[float, Path]:
    start = time.perf_counter()
    run_dir = submitted([*args, f"results_dir={results}"])
    return time.perf_counter() - start, run_dir


def cold(results: Path) -> float:
    """One run with the extension cache moved aside (put back after)."""
    aside = CACHE.with_name(CACHE.name + ".aside")
    if CACHE.exists():
        shutil.rmtree(aside, ignore_errors=True)
        CACHE.rename(aside)
    try:
        return timed(["tiny"], results)[0]
    finally:
        if aside.exists():
            shutil.rmtree(CACHE, ignore_errors=True)
            aside.rename(CACHE)


def main() -> None:
    repeats, _, _ = words(3)
    with scratch("rh-bench-") as results:
        rows = [("`./submit-job.sh tiny`, cold (JIT op build)", [cold(results) for _ in range(repeats)], None),
                ("`./submit-job.sh tiny`, warm", [timed(["tiny"], results)[0] for _ in range(repeats)], None)]
        eight = [timed(["tiny", "tp=2", "pp=2", "dp=2"], results) for _ in range(repeats)]
        rss = [max(s["training"]["max_rss_bytes_per_rank"], s["restart"]["max_rss_bytes_per_rank"])
               for s in (summary(d) for _, d in eight)]
        rows.append(("`./submit-job.sh tiny tp=2 pp=2 dp=2` (8 ranks), warm", [t for t, _ in eight], max(rss)))
    table([f"case ({repeats} runs)", "median s", "min s", "max s", "peak RSS per rank"],
          ([name, *(f"{f(v):.1f}" for f in (statistics.median, min, max)), f"{peak / 2**20:.0f} MiB" if peak else "-"]
           for name, v, peak in rows))


if __name__ == "__main__":
    main()
