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

from benchmarks.common import median, scratch, submitted, summary, table, words
from restart_harness.schema import LOAD_CATEGORIES

BASE = ["small", "dp=2", "iters=6", "save_interval=2", "after=1", "cache=drop"]
CASES = [("anatomy=false", ["anatomy=false"]), ("anatomy=true", ["anatomy=true"]),
         ("trace=true", ["anatomy=true", "trace=true"])]
KEYS = ("blocking", "durable", "load", "step")


def main() -> None:
    repeats, _, args = words(3, runs=True)
    base = BASE + args
    figures: dict[str, dict[str, list]] = {name: {k: [] for k in KEYS} for name, _ in CASES}
    digests: list[float] = []
    worst = 0.0
    with scratch("rh-bench-anatomy-") as results:
        for _ in range(repeats):
            for name, extra in CASES:
                d = submitted([*base, *extra, f"results_dir={results}"])
                s, f = summary(d), figures[name]
                saves = s["checkpoint"]["saves"][1:] or s["checkpoint"]["saves"]
                f["blocking"] += [x["blocking_seconds"] for x in saves]
                f["durable"] += [x["durable_seconds"] for x in saves]
                f["load"].append(s["restart"]["phases"].get("checkpoint_load"))
                f["step"].append(s["training"]["step_seconds_median"])
                for r in (s["restart"].get("load_breakdown") or {}).get("per_rank", []):
                    total = sum(r[f"{c}_seconds"] or 0.0 for c in LOAD_CATEGORIES)
                    worst = max(worst, abs(total - r["measured_seconds"]) / r["measured_seconds"])
                for path in (d / "events" / "checkpoint").glob("rank-*.jsonl"):
                    digests += [e["seconds"] for e in map(json.loads, path.read_text().splitlines())
                                if e["event"] == "digest"]
    medians = {name: {k: median(v) for k, v in f.items()} for name, f in figures.items()}
    ref = medians["anatomy=false"]
    print(f"`{' '.join(base)}`, {repeats} repeats per case, interleaved; medians (ratio to anatomy=false)\n")
    table(["case", "save blocking s", "save durable s", "restart checkpoint_load s", "training step s"],
          ([name, *(f"{f[k]:.3f} ({f[k] / ref[k]:.2f}x)" if f[k] and ref[k] else "-" for k in KEYS)]
           for name, f in medians.items()))
    d = median(digests)
    print(f"\nverification digest: median {d:.4f} s per rank and save = {d / ref['blocking']:.1%} of the default "
          f"engine's median blocking save ({ref['blocking']:.3f} s), over {len(digests)} digests")
    print(f"breakdown vs measured checkpoint_load: largest difference {worst:.2%} over every rank of every restart")


if __name__ == "__main__":
    main()
