#!/usr/bin/env python3
"""What observing costs, and what verification costs: the same run with anatomy=false, anatomy=true (the default)
and trace=true, interleaved, with the breakdown's agreement with the measured load.

Method
- Cases: `./submit-job.sh small dp=2 iters=6 save_interval=2 after=1 cache=drop` (override with key=value
  arguments) with anatomy=false, anatomy=true and anatomy=true trace=true; REPEATS runs of each, the three
  interleaved per repeat so that drift of the virtual disk hits all alike.
- Per run, from summary.json: every save's blocking and durable seconds (slowest rank; the first save of a run is
  dropped as warm-up), the restart's checkpoint_load seconds, the median training step (rank 0).
- Overhead: each case's median over runs divided by anatomy=false's median (1.00 = no cost).
- Verification cost: each rank's digest seconds just before each save (events `digest`), median over all of them,
  divided by the median blocking seconds of the anatomy=false saves (the default engine's save).
- Agreement: for every rank of every restart with anatomy on, |sum of categories - checkpoint_load| / checkpoint_load;
  the largest is reported.

Usage: .venv/bin/python -m benchmarks.anatomy [REPEATS] [key=value ...]   (prints Markdown tables)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.common import median, submitted
from restart_harness.schema import LOAD_CATEGORIES

BASE = ["small", "dp=2", "iters=6", "save_interval=2", "after=1", "cache=drop"]
CASES = [("anatomy=false", ["anatomy=false"]), ("anatomy=true", ["anatomy=true"]),
         ("trace=true", ["anatomy=true", "trace=true"])]


def main() -> None:
    args = sys.argv[1:]
    repeats = int(args.pop(0)) if args and args[0].isdigit() else 3
    base = BASE + args
    results = Path(tempfile.mkdtemp(prefix="rh-bench-anatomy-"))
    runs: dict[str, list[Path]] = {name: [] for name, _ in CASES}
    for _ in range(repeats):
        for name, extra in CASES:
            runs[name].append(submitted([*base, *extra, f"results_dir={results}"]))
    figures: dict[str, dict[str, float | None]] = {}
    digests: list[float] = []
    worst = 0.0
    for name, dirs in runs.items():
        blocking, durable, load, step = [], [], [], []
        for d in dirs:
            s = json.loads((d / "summary.json").read_text())
            saves = s["checkpoint"]["saves"][1:] or s["checkpoint"]["saves"]
            blocking += [x["blocking_seconds"] for x in saves]
            durable += [x["durable_seconds"] for x in saves]
            load.append(s["restart"]["phases"].get("checkpoint_load"))
            step.append(s["training"]["step_seconds_median"])
            lb = s["restart"].get("load_breakdown")
            for r in (lb or {}).get("per_rank", []):
                total = sum(r[f"{c}_seconds"] or 0.0 for c in LOAD_CATEGORIES)
                worst = max(worst, abs(total - r["measured_seconds"]) / r["measured_seconds"])
            for path in (d / "events" / "checkpoint").glob("rank-*.jsonl"):
                digests += [e["seconds"] for e in map(json.loads, path.read_text().splitlines())
                            if e["event"] == "digest"]
        figures[name] = {"blocking": median(blocking), "durable": median(durable), "load": median(load),
                         "step": median(step)}
    ref = figures["anatomy=false"]
    print(f"`{' '.join(base)}`, {repeats} repeats per case, interleaved; medians (ratio to anatomy=false)\n")
    print("| case | save blocking s | save durable s | restart checkpoint_load s | training step s |")
    print("|---|---|---|---|---|")
    for name, f in figures.items():
        cells = [f"{f[k]:.3f} ({f[k] / ref[k]:.2f}x)" if f[k] and ref[k] else "-"
                 for k in ("blocking", "durable", "load", "step")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    d = median(digests)
    print(f"\nverification digest: median {d:.4f} s per rank and save = {d / ref['blocking']:.1%} of the default "
          f"engine's median blocking save ({ref['blocking']:.3f} s), over {len(digests)} digests")
    print(f"breakdown vs measured checkpoint_load: largest difference {worst:.2%} over every rank of every restart")
    shutil.rmtree(results, ignore_errors=True)


if __name__ == "__main__":
    main()
