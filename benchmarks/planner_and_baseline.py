"""Benchmark: how fast the planner answers, and what the storage baseline reports with each tool.

Method (run on an idle machine; nothing else writing to the disk):
1. Planner: `./submit-job.sh 70B tp=8 pp=4 dp=2 plan=json bandwidth_gbps=5` (64 ranks, 760 files), REPEATS times in
   sequence; wall time of the whole command (interpreter start included) and the plan's own `plan_seconds`;
   median, min, max.
2. Storage baseline: `./submit-job.sh baseline dir=DIR tool=T file_bytes=S ranks=R` for T in fio, builtin, S in
   16M, 256M, R in 1, 2; REPEATS times each, in sequence, with a private cache folder; medians of write_mib_s and
   read_mib_s, and what mincore reported before each read.

Usage: python -m benchmarks.planner_and_baseline [DIR] [REPEATS]   (DIR defaults to ./results; prints a Markdown
table for the README). Uses the interpreter in RH_PYTHON through submit-job.sh, like a user would.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, words


def _run(args: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([str(REPO / "submit-job.sh"), *args], check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc.stdout


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "results")
    repeats = words(5, argv=sys.argv[2:])[0]
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "RH_CACHE_DIR": cache}  # a private cache: every probe measures
        planned = [_run(["70B", "tp=8", "pp=4", "dp=2", "plan=json", "bandwidth_gbps=5"], env) for _ in range(repeats)]
        walls, inner = [w for w, _ in planned], [json.loads(out)["plan_seconds"] for _, out in planned]
        print("| planner, 70B tp=8 pp=4 dp=2 (760 files) | median s | min s | max s |\n|---|---|---|---|")
        print(f"| whole command | {statistics.median(walls):.3f} | {min(walls):.3f} | {max(walls):.3f} |")
        print(f"| plan_seconds | {statistics.median(inner):.4f} | {min(inner):.4f} | {max(inner):.4f} |\n")
        print("| tool | file_bytes | ranks | write MiB/s (median) | read MiB/s (median) | read cache observed |")
        print("|---|---|---|---|---|---|")
        for tool, size, ranks in itertools.product(("fio", "builtin"), ("16M", "256M"), (1, 2)):
            records = []
            for _ in range(repeats):
                _run(["baseline", f"dir={target}", f"tool={tool}", f"file_bytes={size}", f"ranks={ranks}"], env)
                records.append(json.loads(next(Path(cache).rglob(f"*x{ranks}.json")).read_text()))
                for p in Path(cache).rglob("*.json"):
                    p.unlink()
            print(f"| {tool} | {size} | {ranks} | {statistics.median(r['write_mib_s'] for r in records):,.0f} | "
                  f"{statistics.median(r['read_mib_s'] for r in records):,.0f} | "
                  f"{', '.join(sorted({r['read_cache']['observed'] for r in records}))} |")


if __name__ == "__main__":
    main()
