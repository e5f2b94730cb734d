#!/usr/bin/env python3
"""What would cut a restart (issue 55 item 2): one checkpoint restarted with one change at a time, every phase's
saving against the same restart unchanged, and where each phase's seconds went (attribution=python).

Method: docs/benchmark-methods.md#restart_what_if

Usage: <python> -m benchmarks.restart_what_if [ROUNDS] [MODEL key=value ...]   (prints Markdown tables)
       <python> -m benchmarks.restart_what_if reuse=/tmp/rh-what-if-.../what-if.json   (the tables again, no runs)
       PREBUILT_PYTHON=/path/to/venv/bin/python adds the prebuilt-ops arm.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.attribution_overhead import PHASES, figures  # each phase of a restart record, and `total`
from benchmarks.common import median_table, restarted, rotated, scratch, spread, submitted, summary, table, words

STAGE = "/dev/shm/rh-what-if-stage"


def arms() -> list[tuple[str, list[str], dict]]:
    """(name, restart keys, how the command is run: python=, fresh_cache=True)."""
    out = [("baseline", [], {}),
           ("prefork", ["launcher=prefork"], {}),
           ("extension cache cold", [], {"fresh_cache": True}),
           ("environment cold", ["env_cache=drop"], {}),
           ("environment staged", ["env_cache=drop", f"env_stage={STAGE}"], {})]
    if os.environ.get("PREBUILT_PYTHON"):
        prebuilt = {"python": os.environ["PREBUILT_PYTHON"]}
        out.insert(2, ("prebuilt ops", [], prebuilt))
        out.append(("environment staged, ops prebuilt", ["env_cache=drop", f"env_stage={STAGE}"], prebuilt))
    return out


def largest(restart: dict, phase: str) -> str:
    p = ((restart.get("attribution") or {}).get("phases") or {}).get(phase)
    return f"{p['causes'][0]['cause']} {p['causes'][0]['seconds']:.2f} s" if p and p["causes"] else "-"


def measure(model: list[str], rounds: int) -> Path:
    """Run the checkpoint and every round's restarts; the record of what ran in which order (what-if.json)."""
    results = Path(tempfile.mkdtemp(prefix="rh-what-if-"))
    Path(STAGE).mkdir(exist_ok=True)
    run_dir = submitted([*model, "launcher=local", "phase=checkpoint", f"results_dir={results}"], python=sys.executable)
    order: list[str] = []
    plan = arms()
    for n in range(rounds):
        for name, keys, how in rotated(plan, n):
            with scratch("rh-what-if-cache-") if how.get("fresh_cache") else contextlib.nullcontext() as cache:
                restarted(run_dir, ["attribution=python", "cache=warm", *keys],
                          python=how.get("python", sys.executable), env=cache and {"RH_CACHE_DIR": str(cache)})
            order.append(name)
            print(f"round {n + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
    record = results / "what-if.json"
    record.write_text(json.dumps({"run": str(run_dir), "model": model, "rounds": rounds, "order": order,
                                  "arms": [name for name, _, _ in plan]}))
    return record


def evaluate(record: Path) -> None:
    w = json.loads(record.read_text())
    run_dir, model, rounds, order, names = Path(w["run"]), w["model"], w["rounds"], w["order"], w["arms"]
    restarts = summary(run_dir)["restarts"]  # phase=checkpoint: re-runs only
    by_round: list[dict[str, dict]] = [{} for _ in range(rounds)]
    for i, (name, r) in enumerate(zip(order, restarts, strict=True)):
        by_round[i // len(names)][name] = r
    loads = [f"{r['machine_load']['loadavg_1min']:.1f}" for r in restarts
             if (r.get("machine_load") or {}).get("loadavg_1min") is not None]
    print(f"{' '.join(model)}; {rounds} rounds of {len(names)} restart-only re-runs, attribution=python cache=warm; "
          f"1-minute load before each launch: {', '.join(loads) or '-'}")
    print("\nMedian seconds per phase (each phase on its slowest rank; total: launcher + process start -> first step)\n")
    median_table("arm", PHASES, {name: [figures(b[name]) for b in by_round] for name in names})
    print("\nSaving against the baseline, s: median over rounds of (baseline - arm) in the round (min to max); "
          "negative: the change costs time\n")
    saved = {name: {p: [figures(b["baseline"])[p] - figures(b[name])[p] for b in by_round] for p in PHASES}
             for name in names[1:]}
    table(["arm", *PHASES], ([name, *(spread(d[p], "+.2f", " to ") for p in PHASES)] for name, d in saved.items()),
          "l" + "r" * len(PHASES))
    print("\nWhere the phase that changed most went (the last round's restart, its largest cause; baseline beside)\n")
    changed = {name: max((p for p in PHASES if p != "total"), key=lambda p: abs(statistics.median(d[p])))
               for name, d in saved.items()}
    table(["arm", "phase", "arm: largest cause", "baseline: largest cause"],
          ([name, f"{p} ({statistics.median(saved[name][p]):+.2f} s)", largest(by_round[-1][name], p),
            largest(by_round[-1]["baseline"], p)] for name, p in changed.items()))
    staged = [r["staging"]["seconds"] for b in by_round for r in [b.get("environment staged")] if r and r.get("staging")]
    if staged:
        print(f"\nstaging the environment into {STAGE}, before the launch: {statistics.median(staged):.2f} s median")
    print(f"\nrun: {run_dir}  (./submit-job.sh report {run_dir} draws these restarts side by side)")


def main() -> None:
    rounds, named, args = words(3, "reuse", runs=True)
    evaluate(Path(named["reuse"]) if "reuse" in named else measure(args or ["tiny", "dp=2"], rounds))


if __name__ == "__main__":
    main()
