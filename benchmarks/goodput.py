#!/usr/bin/env python3
"""Measured goodput under failures against the model's (issue 65 item 4; docs/goodput.md).

Method
- Failure campaigns (`./submit-job.sh endure tiny ...`, campaigns/endure.py) with engine=default and engine=lazy,
  launcher=prefork, at three failure rates (MTBFS, seconds), each for DURATION seconds at SAVE_INTERVAL steps, seed
  1; then, for the middle rate, at three checkpoint intervals around the model's best one (from the middle rate's
  campaign: half, once and twice it, in steps), so that the measured campaigns bracket the predicted optimum.
- Each campaign writes endure.json: the measured goodput (productive step time over wall time) and, beside it, the
  model's expected goodput at the campaign's own measured costs (a save's training lost, the mean restart's start-up
  + preparation + restore + first step, the median step, the given MTBF: predict/goodput.py). Per campaign: the
  failures, the restarts verified, the final state against the failure-free run's, measured and modelled goodput
  and their difference (modelled - measured); the bracket: measured goodput per interval, and the model's best.
- The machine's load matters (2 shared cores): every launch says when it was busy; run it on a quiet machine.

Usage: <python> -m benchmarks.goodput [duration=SECONDS] [out=DIR]   (default 600 s each, into /tmp/rh-goodput-bench)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MTBFS = (60, 120, 240)
SAVE_INTERVAL = 10
ENGINES = ("default", "lazy")


def campaign(out: Path, engine: str, mtbf: int, duration: int, save_interval: int) -> dict:
    """One campaign; its endure.json (or the reason it failed)."""
    cmd = [sys.executable, str(REPO / "config-n-run.py"), "endure", "tiny", f"engine={engine}", f"mtbf={mtbf}",
           f"duration={duration}", f"save_interval={save_interval}", "seed=1", "launcher=prefork",
           f"results_dir={out}"]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    if not lines or not (Path(lines[-1]) / "endure.json").is_file():
        return {"engine": engine, "mtbf_seconds": mtbf, "error": proc.stderr.strip().splitlines()[-1:]}
    doc = json.loads((Path(lines[-1]) / "endure.json").read_text())
    model = doc.get("model") or {}
    return {"engine": engine, "mtbf_seconds": mtbf, "save_interval": save_interval, "folder": lines[-1],
            "failures": len(doc["failures"]), "restarts": doc["restarts"], "final_state_equal":
            doc["final_state"]["equal"], "measured_goodput": doc["goodput"]["goodput"],
            "model_goodput": model.get("expected_goodput"), "best_interval_steps": model.get("best_interval_steps"),
            "error": (model["expected_goodput"] - doc["goodput"]["goodput"]) if model else None}


def main(argv: list[str]) -> int:
    args = dict(a.split("=", 1) for a in argv)
    duration, out = int(args.get("duration", 600)), Path(args.get("out", "/tmp/rh-goodput-bench"))
    rows = [campaign(out, e, m, duration, SAVE_INTERVAL) for e in ENGINES for m in MTBFS]
    middle = next((r for r in rows if r["mtbf_seconds"] == MTBFS[1] and r.get("best_interval_steps")), None)
    bracket = []
    if middle:
        best = middle["best_interval_steps"]
        bracket = [campaign(out, middle["engine"], MTBFS[1], duration, max(1, round(best * f))) for f in (0.5, 1, 2)]
    print("engine   mtbf_s  interval  failures  verified  final=  measured  model   model-measured")
    for r in rows + bracket:
        if r.get("measured_goodput") is None:
            print(f"{r['engine']:8} {r['mtbf_seconds']:6}  failed: {r['error']}")
            continue
        print(f"{r['engine']:8} {r['mtbf_seconds']:6}  {r['save_interval']:8}  {r['failures']:8}  "
              f"{r['restarts']['verified']:8}  {r['final_state_equal']!s:6}  {r['measured_goodput']:8.3f}  "
              f"{r['model_goodput'] or float('nan'):6.3f}  {r['error'] if r['error'] is not None else float('nan'):+.3f}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "goodput-bench.json").write_text(json.dumps({"rates": rows, "bracket": bracket}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
