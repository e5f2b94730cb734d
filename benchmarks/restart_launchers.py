#!/usr/bin/env python3
"""Restart time by launcher and page-cache state, from restart-only re-runs of one checkpoint.

Method
- For each launcher (local = DeepSpeed's launcher, torchrun): one `phase=checkpoint` run of MODEL (default
  `tiny dp=2`), then `phase=restart run=<it> cache=drop repeats=R` and `phase=restart run=<it> cache=warm
  repeats=R`, in sequence, on an otherwise idle machine. Every restart is a fresh launch from the same committed
  checkpoint; the harness verifies each one.
- Figures come from summary.json's `restarts[]` (the harness's own per-rank marks): `launch_seconds` (launcher
  start -> last rank's process start), `total_seconds` (slowest rank's process start -> first step done, the
  verification digest excluded), `checkpoint_load` phase, `wall_seconds` (the whole launch, teardown included),
  and the cache state `observed` (so a `drop` that did not evict shows up).
- Medians, min and max over the R restarts of each case.

Usage: .venv/bin/python -m benchmarks.restart_launchers [REPEATS] [MODEL key=value ...]   (prints a Markdown table)
"""

from __future__ import annotations

from collections import Counter

from benchmarks.common import scratch, spread, submitted, summary, words


def main() -> None:
    repeats, _, model = words(5, runs=True)
    model = model or ["tiny", "dp=2"]
    print(f"{' '.join(model)}; {repeats} restarts per case; median (min-max) seconds")
    print("| launcher | cache | observed | launch_seconds | total_seconds | checkpoint_load | wall_seconds |")
    print("|---|---|---|---|---|---|---|")
    with scratch("rh-bench-") as results:
        for launcher in ("local", "torchrun"):
            run_dir = submitted([*model, f"launcher={launcher}", "phase=checkpoint", f"results_dir={results}"])
            seen = 0
            for cache in ("drop", "warm"):
                submitted(["phase=restart", f"run={run_dir}", f"cache={cache}", f"repeats={repeats}"])
                restarts = summary(run_dir)["restarts"][seen:]
                seen += len(restarts)
                observed = Counter(r["cache"]["observed"] for r in restarts)
                print(f"| {launcher} | {cache} | {', '.join(f'{k} x{v}' for k, v in observed.items())} | "
                      + " | ".join(spread([r[k] if k in r else r["phases"][k] for r in restarts])
                                   for k in ("launch_seconds", "total_seconds", "checkpoint_load", "wall_seconds"))
                      + " |")


if __name__ == "__main__":
    main()
