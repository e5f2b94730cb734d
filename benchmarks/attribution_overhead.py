#!/usr/bin/env python3
"""What attribution= costs: restarts of one checkpoint, sampled and not, interleaved.

Method
- One `phase=checkpoint` run of MODEL (default `tiny dp=2`, DeepSpeed's launcher), attribution off.
- ROUNDS rounds (default 5); each round one restart-only re-run per mode (attribution=off, python, native), in an
  order rotated every round so that no mode always follows another; every restart `cache=warm env_cache=warm`
  (nothing read from storage that the previous one read: the page cache is not what varies).
- Per mode, per phase (the launcher's seconds, restart.phases, and `total`: the launcher plus process start -> first
  step), the median over the rounds; the overhead is the median of each round's ratio to that round's unsampled
  restart, so a machine whose speed drifts between rounds cancels out of it.
- Also the time the summary takes to read the sampler's trace (finalize of the run, the sampled records only):
  that is after the run, never inside a phase.

Usage: .venv/bin/python -m benchmarks.attribution_overhead [ROUNDS] [MODEL key=value ...]   (prints Markdown tables)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import median_table, restarted, rotated, spread, submitted, words

MODES = ("off", "python", "native")
PHASES = ("launcher", "imports", "dist_init", "model_build", "engine_init", "checkpoint_load", "first_step", "total")


def figures(restart: dict) -> dict[str, float]:
    return {"launcher": restart["launch_seconds"], **restart["phases"],
            "total": restart["launch_seconds"] + restart["total_seconds"]}


def main() -> None:
    rounds, _, model = words(5, runs=True)
    model = model or ["tiny", "dp=2"]
    results = Path(tempfile.mkdtemp(prefix="rh-attribution-"))
    run_dir = submitted([*model, "launcher=local", "phase=checkpoint", f"results_dir={results}"], python=sys.executable)
    by_round: list[dict[str, dict[str, float]]] = [{} for _ in range(rounds)]
    restarts = []
    for n in range(rounds):
        for mode in rotated(MODES, n):
            restarts.append(restarted(run_dir, [f"attribution={mode}", "cache=warm", "env_cache=warm"],
                                      python=sys.executable))
            by_round[n][mode] = figures(restarts[-1])
            print(f"round {n + 1}/{rounds}: {mode}", file=sys.stderr, flush=True)
    print(f"{' '.join(model)}, launcher=local; {rounds} rounds; machine load before each launch: "
          + ", ".join(f"{r['machine_load']['cpu_busy_fraction']:.0%}" for r in restarts if r.get("machine_load")))
    print()
    median_table("mode", PHASES, {f"{mode} (median s)": [b[mode] for b in by_round] for mode in MODES})
    for mode in MODES[1:]:
        cells = [spread([b[mode][p] / b["off"][p] for b in by_round if b["off"][p] > 0]) for p in PHASES]
        print(f"| {mode} / off | " + " | ".join(cells) + " |")
    from restart_harness.results import finalize

    start = time.perf_counter()
    finalize.finalize(run_dir, state="complete")
    print(f"\nfinalize of the run ({len(restarts)} restarts, {rounds * (len(MODES) - 1)} sampled): "
          f"{time.perf_counter() - start:.1f} s; samples.json of one sampled restart: "
          f"{(run_dir / 'profiles' / restarts[1]['record'] / 'samples.json').stat().st_size / 2**20:.1f} MiB"
          if len(restarts) > 1 and (run_dir / 'profiles' / restarts[1]['record']).exists() else "")
    print(f"\nrun: {run_dir}")


if __name__ == "__main__":
    main()
