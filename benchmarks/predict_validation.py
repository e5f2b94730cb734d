#!/usr/bin/env python3
"""The prediction model checked on runs it was not fitted to (issue 26, docs/prediction.md).

Method: docs/benchmark-methods.md#predict_validation

Usage: <python> -m benchmarks.predict_validation [REPEATS] [out=DIR] [reuse=true]
       (default 2 rounds into /tmp/rh-predict-bench; reuse=true: no runs, fit and predict the runs already there)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.common import REPO, measure_then_evaluate, median, object_store, recorded, summary

BASE = ["iters=6", "save_interval=2", "after=1", "cache=drop"]
CALIBRATE = [
    ("tiny 1 rank", ["tiny"]), ("tiny dp=2", ["tiny", "dp=2"]), ("tiny tp=2", ["tiny", "tp=2"]),
    ("tiny dp=4", ["tiny", "dp=4"]), ("small dp=2", ["small", "dp=2"]), ("small tp=2 pp=2", ["small", "tp=2", "pp=2"]),
    ("emulated 1B/8 dp=2", ["1B", "shrink=8", "dp=2", "emulate=true", "keep=false"]),
    ("emulated 1B/4 dp=2", ["1B", "shrink=4", "dp=2", "emulate=true", "keep=false"])]
S3 = "ckpt_dir=s3://bench/predict"
HELD_OUT = [
    ("larger: emulated 3B/4 dp=2", ["3B", "shrink=4", "dp=2", "emulate=true", "keep=false"]),
    ("more ranks: tiny tp=2 pp=2 dp=2", ["tiny", "tp=2", "pp=2", "dp=2"]),
    ("another engine: small dp=2 dcp", ["small", "dp=2", "engine=dcp"]),
    ("another target: small dp=2 on S3", ["small", "dp=2", S3, "keep=false"])]
FOCUS = ("save_durable_seconds", "restart_total_with_launch_seconds")


def calibrate(runs: Path, out: Path) -> None:
    subprocess.run([str(REPO / "submit-job.sh"), "calibrate", f"runs={runs}", f"out={out}"], check=True,
                   capture_output=True, text=True)


def predicted_vs_measured(run_dir: Path, calibration: dict) -> dict:
    """The held-out run predicted as it would have predicted itself before launch, with this calibration."""
    from restart_harness import resolve
    from restart_harness.predict import forecast
    from restart_harness.results import prediction

    run, measured = resolve.read(run_dir), summary(run_dir)
    made = forecast.build(run, run.facts["host"]["cpus"], forecast.storage(run, record=measured.get("baseline")),
                          calibration)
    return prediction.compare(made, measured)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def measure(out: Path, repeats: int) -> None:
    """Every case REPEATS times, interleaved; out/cases.json names each held-out run's case."""
    with object_store("rh-predict-s3", 6144):
        recorded(out, repeats, [*(("calibrate", f"calibration: {n}", [*t, *BASE], None) for n, t in CALIBRATE),
                                *(("held-out", f"held out: {n}", [*t, *BASE], n) for n, t in HELD_OUT)])


def evaluate(out: Path) -> None:
    """Fit on out/calibrate, predict out/held-out (reuse=true: from runs made earlier, e.g. after a model change)."""
    from restart_harness.results.prediction import PHASES

    held = json.loads((out / "cases.json").read_text())
    calibrate(out / "calibrate", out / "calibration-calibrate-set.json")
    calibration = json.loads((out / "calibration-calibrate-set.json").read_text())
    order = [name for name, _ in HELD_OUT]
    runs = sorted(held.items(), key=lambda item: (order.index(item[1]), item[0]))
    rows = [(name, predicted_vs_measured(Path(d), calibration)) for d, name in runs]
    (out / "held-out.json").write_text(json.dumps([{"case": n, "run": d, **c} for (d, _), (n, c) in zip(runs, rows)],
                                                  indent=1))
    print(f"| held-out run | {' | '.join(p.removesuffix('_seconds') for p in PHASES)} | within range |")
    print("|---" * (len(PHASES) + 2) + "|")
    for name, c in rows:
        inside = [r["within_range"] for r in c["phases"].values() if r["within_range"] is not None]
        print(f"| {name} | {' | '.join(pct(c['phases'].get(p, {}).get('rel_error')) for p in PHASES)} | "
              f"{sum(inside)}/{len(inside)} |")
    medians = {p: median([abs(e) for _, c in rows if (e := c["phases"].get(p, {}).get("rel_error")) is not None])
               for p in PHASES}
    print(f"| **median abs. error** | {' | '.join('-' if m is None else f'{m:.0%}' for m in medians.values())} | |")
    for p in FOCUS:
        print(f"{p}: median absolute error over {len(rows)} held-out runs {medians[p]:.1%} (goal <= 15%)")
    calibrate(out, out / "calibration-all.json")
    print(f"calibration from every run: {out / 'calibration-all.json'} (ship: cp it configs/calibration/default.json)")


if __name__ == "__main__":
    measure_then_evaluate(measure, evaluate, 2, "/tmp/rh-predict-bench")
