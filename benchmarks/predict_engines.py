#!/usr/bin/env python3
"""The prediction model per checkpoint engine (issue 66, docs/prediction.md#per-engine-errors-measured-here).

Method: docs/benchmark-methods.md#predict_engines

Usage: <python> -m benchmarks.predict_engines [REPEATS] [out=DIR] [reuse=true]   (default 1 round, /tmp/rh-engines)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import measure_then_evaluate, recorded, summary
from benchmarks.predict_validation import calibrate, pct, predicted_vs_measured

ENGINES = ("default", "torchsnapshot", "dcp", "fastpersist", "lazy")
BASE = ["iters=2", "save_interval=1", "after=1", "launcher=prefork", "env_cache=keep"]
# as campaigns/study runs its cells (its emulate_memory_gib: a quarter of the memory available, about 5 GiB here)
STUDY_LIKE = ["emulate=true", "keep=false", "launcher=local", "iters=1", "save_interval=1", "after=1",
              "emulate_memory_gib=5"]
STUDY_ENGINES = ("default", "torchsnapshot")
CALIBRATE = [("tiny dp=1", ["tiny", *BASE], ENGINES), ("tiny dp=2", ["tiny", "dp=2", *BASE], ENGINES),
             *((f"emulated {words}", [*words.split(), *STUDY_LIKE], STUDY_ENGINES) for words in (
                 "1B shrink=1 tp=4", "7B shrink=4 dp=8", "7B shrink=32 tp=2 pp=4", "13B shrink=32 pp=4 dp=2",
                 "70B shrink=32 tp=4 pp=4", "70B shrink=16 pp=16"))]
HELD_OUT = [("tiny tp=2", ["tiny", "tp=2", *BASE], ENGINES)]
SHOWN = ("save_blocking_seconds", "save_durable_seconds", "restart_checkpoint_load_seconds",
         "restart_total_with_launch_seconds")


def measure(out: Path, repeats: int) -> None:
    recorded(out, repeats, [(folder, f"{folder}: {name} engine={e}", [*tokens, f"engine={e}"],
                             [name, e] if folder == "held-out" else None)
                            for folder, cases in (("calibrate", CALIBRATE), ("held-out", HELD_OUT))
                            for name, tokens, engines in cases for e in engines], check=False)


def _cell(row: dict) -> str:
    return "n/c" if row.get("rel_error") is None and row.get("not_comparable") else pct(row.get("rel_error"))


def evaluate(out: Path) -> None:
    held = json.loads((out / "cases.json").read_text())
    cal = out / "calibration.json"
    if not cal.exists():
        calibrate(out / "calibrate", cal)
    calibration = json.loads(cal.read_text())
    print(f"| engine | held-out run | {' | '.join(p.removesuffix('_seconds') for p in SHOWN)} | other work's CPU share "
          "(save / restart launch) |\n" + "|---" * (len(SHOWN) + 3) + "|")
    errors: dict[str, list[float]] = {}
    for run_dir, (name, engine) in sorted(held.items(), key=lambda i: (i[1][1], i[1][0])):
        c = predicted_vs_measured(Path(run_dir), calibration)
        s = summary(Path(run_dir))
        loads = [((r.get("machine_load") or {}).get("during") or {}).get("other_cpu_fraction")
                 for r in (s["checkpoint"], s["restart"])]
        print(f"| {engine} | {name} | {' | '.join(_cell(c['phases'].get(p, {})) for p in SHOWN)} | "
              f"{' / '.join('-' if x is None else f'{x:.0%}' for x in loads)} |")
        for p in SHOWN:
            row = c["phases"].get(p, {})
            if row.get("rel_error") is not None:
                errors.setdefault(p, []).append(abs(row["rel_error"]))
            if row.get("not_comparable"):
                print(f"  {engine} {name} {p}: not compared: {row['not_comparable']}", file=sys.stderr)
    for p, e in errors.items():
        print(f"{p}: median absolute error {statistics.median(e):.0%} over {len(e)} held-out runs")


if __name__ == "__main__":
    measure_then_evaluate(measure, evaluate, 1, "/tmp/rh-engines")
