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

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import submitted
from restart_harness.files.cache_dir import extensions_dir

CACHE = extensions_dir()


def timed(args: list[str], results: Path) -> tuple[float, Path]:
    start = time.perf_counter()
    run_dir = submitted([*args, f"results_dir={results}"])
    return time.perf_counter() - start, run_dir


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    results = Path(tempfile.mkdtemp(prefix="rh-bench-"))
    rows = []
    cold = []
    for _ in range(repeats):
        aside = CACHE.with_name(CACHE.name + ".aside")
        if CACHE.exists():
            shutil.rmtree(aside, ignore_errors=True)
            CACHE.rename(aside)
        try:
            cold.append(timed(["tiny"], results)[0])
        finally:
            if aside.exists():
                shutil.rmtree(CACHE, ignore_errors=True)
                aside.rename(CACHE)
    rows.append(("`./submit-job.sh tiny`, cold (JIT op build)", cold, None))
    warm = [timed(["tiny"], results)[0] for _ in range(repeats)]
    rows.append(("`./submit-job.sh tiny`, warm", warm, None))
    eight, rss = [], []
    for _ in range(repeats):
        seconds, run_dir = timed(["tiny", "tp=2", "pp=2", "dp=2"], results)
        summary = json.loads((run_dir / "summary.json").read_text())
        eight.append(seconds)
        rss.append(max(summary["training"]["max_rss_bytes_per_rank"], summary["restart"]["max_rss_bytes_per_rank"]))
    rows.append(("`./submit-job.sh tiny tp=2 pp=2 dp=2` (8 ranks), warm", eight, max(rss)))
    print(f"| case ({repeats} runs) | median s | min s | max s | peak RSS per rank |")
    print("|---|---|---|---|---|")
    for name, values, peak in rows:
        mem = f"{peak / 2**20:.0f} MiB" if peak else "-"
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} | {mem} |")
    shutil.rmtree(results, ignore_errors=True)


if __name__ == "__main__":
    main()
