#!/usr/bin/env python3
"""What would cut a restart (issue 55 item 2): one checkpoint restarted with one change at a time, every phase's
saving against the same restart unchanged, and where each phase's seconds went (attribution=python).

Method
- One `phase=checkpoint` run of MODEL (default `tiny dp=2`), DeepSpeed's launcher (`launcher=local`).
- ROUNDS rounds (default 3). Each round restarts that checkpoint once per arm, as restart-only re-runs
  (`./submit-job.sh restart run=...`), every one `attribution=python cache=warm` (the checkpoint's pages are in the
  page cache in every arm: the checkpoint's storage is not what varies here). The arms, in an order rotated every
  round so that no arm always follows another:
  - `baseline`: DeepSpeed's launcher, nothing evicted (`cache=warm` leaves the environment's pages too), the
    extension cache warm (DeepSpeed's CPU op built by an earlier run and loaded by torch's JIT loader);
  - `prefork`: `launcher=prefork` (one process imports the stack, then forks the ranks);
  - `prebuilt ops`: the same restart from a second Python environment whose DeepSpeed was installed with the op
    compiled in (`DS_BUILD_SHM_COMM=1 pip install deepspeed==0.19.8`; given as PREBUILT_PYTHON=path, skipped without);
  - `extension cache cold`: a fresh, empty RH_CACHE_DIR, so the restart's ranks JIT-build the op first (what the first
    restart on a new machine, or after a reinstall, pays);
  - `environment cold`: `env_cache=drop` (the environment's files evicted from the page cache before the launch: the
    shared file system's first read after a job starts);
  - `environment staged`: `env_cache=drop env_stage=/dev/shm/...` (the same cold environment copied to node-local
    memory before the launch; the copy's seconds are reported beside the restart, not inside it). torch keys a JIT
    build on its sources' paths, which the copy changes: unless the op was compiled in at install, the staged
    restart builds it again (envstage.py);
  - `environment staged, ops prebuilt`: both (with PREBUILT_PYTHON).
- Each phase (the launcher's seconds before any rank starts, the six restart phases on their slowest rank, and
  `total`: launcher + process start -> first step) per arm: the median over rounds, and the saving against the
  baseline: the median over rounds of (baseline - arm) in that round, so drift between rounds cancels; with its range.
- The largest cause of each phase that changed most (from the restart's attribution, docs/attribution.md), so the
  saving is explained, not only measured. The machine's load before each launch is printed.
- All restarts are records of one run: `./submit-job.sh report <run>` draws them side by side
  (restart_causes_seconds.png), each labelled by what its launch differed in.

Usage: <python> -m benchmarks.restart_what_if [ROUNDS] [MODEL key=value ...]   (prints Markdown tables)
       <python> -m benchmarks.restart_what_if reuse=/tmp/rh-what-if-.../what-if.json   (the tables again, no runs)
       PREBUILT_PYTHON=/path/to/venv/bin/python adds the prebuilt-ops arm.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.attribution_overhead import PHASES, figures  # each phase of a restart record, and `total`
from benchmarks.common import REPO, median_table

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


def cli(args: list[str], python: str | None = None, env: dict | None = None) -> Path:
    proc = subprocess.run([python or sys.executable, str(REPO / "config-n-run.py"), *args], check=False,
                          capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if proc.returncode:
        sys.exit(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def largest(restart: dict, phase: str) -> str:
    att = restart.get("attribution") or {}
    p = (att.get("phases") or {}).get(phase)
    if not p or not p["causes"]:
        return "-"
    c = p["causes"][0]
    return f"{c['cause']} {c['seconds']:.2f} s"


def measure(model: list[str], rounds: int) -> Path:
    """Run the checkpoint and every round's restarts; the record of what ran in which order (what-if.json)."""
    results = Path(tempfile.mkdtemp(prefix="rh-what-if-"))
    Path(STAGE).mkdir(exist_ok=True)
    run_dir = cli([*model, "launcher=local", "phase=checkpoint", f"results_dir={results}"])
    order: list[str] = []
    plan = arms()
    for n in range(rounds):
        k = n % len(plan)
        for name, keys, how in plan[k:] + plan[:k]:
            env = {}
            if how.get("fresh_cache"):
                env["RH_CACHE_DIR"] = tempfile.mkdtemp(prefix="rh-what-if-cache-")
            cli(["restart", f"run={run_dir}", "attribution=python", "cache=warm", *keys],
                python=how.get("python"), env=env)
            if env:
                shutil.rmtree(env["RH_CACHE_DIR"], ignore_errors=True)
            order.append(name)
            print(f"round {n + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
    record = results / "what-if.json"
    record.write_text(json.dumps({"run": str(run_dir), "model": model, "rounds": rounds, "order": order,
                                  "arms": [name for name, _, _ in plan]}))
    return record


def evaluate(record: Path) -> None:
    w = json.loads(record.read_text())
    run_dir, model, rounds, order, names = Path(w["run"]), w["model"], w["rounds"], w["order"], w["arms"]
    restarts = json.loads((run_dir / "summary.json").read_text())["restarts"]  # phase=checkpoint: re-runs only
    by_round: list[dict[str, dict]] = [{} for _ in range(rounds)]
    for i, (name, r) in enumerate(zip(order, restarts, strict=True)):
        by_round[i // len(names)][name] = r
    loads = [f"{r['machine_load']['loadavg_1min']:.1f}" for r in restarts
             if (r.get("machine_load") or {}).get("loadavg_1min") is not None]
    print(f"{' '.join(model)}; {rounds} rounds of {len(names)} restart-only re-runs, attribution=python cache=warm; "
          f"1-minute load before each launch: {', '.join(loads) or '-'}")
    print()
    print("Median seconds per phase (each phase on its slowest rank; total: launcher + process start -> first step)")
    print()
    median_table("arm", PHASES, {name: [figures(b[name]) for b in by_round] for name in names})
    print()
    print("Saving against the baseline, s: median over rounds of (baseline - arm) in the round (min to max); "
          "negative: the change costs time")
    print()
    print("| arm | " + " | ".join(PHASES) + " |")
    print("|---|" + "---:|" * len(PHASES))
    for name in names[1:]:
        cells = []
        for p in PHASES:
            d = [figures(b["baseline"])[p] - figures(b[name])[p] for b in by_round]
            cells.append(f"{statistics.median(d):+.2f} ({min(d):+.2f} to {max(d):+.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("Where the phase that changed most went (the last round's restart, its largest cause; baseline beside)")
    print()
    print("| arm | phase | arm: largest cause | baseline: largest cause |")
    print("|---|---|---|---|")
    last = by_round[-1]
    for name in names[1:]:
        d = {p: statistics.median(figures(b["baseline"])[p] - figures(b[name])[p] for b in by_round)
             for p in PHASES if p != "total"}
        phase = max(d, key=lambda p: abs(d[p]))
        print(f"| {name} | {phase} ({d[phase]:+.2f} s) | {largest(last[name], phase)} | "
              f"{largest(last['baseline'], phase)} |")
    staged = [r["staging"]["seconds"] for b in by_round for r in [b.get("environment staged")] if r and r.get("staging")]
    if staged:
        print(f"\nstaging the environment into {STAGE}, before the launch: {statistics.median(staged):.2f} s median")
    print(f"\nrun: {run_dir}  (./submit-job.sh report {run_dir} draws these restarts side by side)")


def main() -> None:
    args = sys.argv[1:]
    reuse = next((a.split("=", 1)[1] for a in args if a.startswith("reuse=")), None)
    args = [a for a in args if not a.startswith("reuse=")]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 3
    evaluate(Path(reuse) if reuse else measure(args or ["tiny", "dp=2"], rounds))


if __name__ == "__main__":
    main()
