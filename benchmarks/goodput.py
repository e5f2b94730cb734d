#!/usr/bin/env python3
"""Measured goodput under failures against the model's (issue 65 item 4; docs/goodput.md).

Method
- Failure campaigns (`./submit-job.sh endure tiny ...`, campaigns/endure.py) with engine=default and engine=lazy,
  launcher=prefork, at three failure rates (MTBFS_S, seconds), each for `duration` seconds (the first rate's long
  enough for FAILURES_AT_FIRST_RATE failures on average: the done-when's campaigns of 10 or more) at SAVE_INTERVAL
  steps, seed 1; then, for default at the first rate, at three checkpoint intervals around the model's best one
  (from that campaign's measured costs: a quarter, once and four times it, in steps), so that the measured
  campaigns bracket the predicted optimum.
- Each campaign writes endure.json: the measured goodput (productive step time over wall time) and the model's
  (results/goodput.py campaign_model, from the campaign's own measured costs: a save's training lost, a restart's
  whole time, the median step) at the MTBF given, then with the two terms by which one finite campaign departs from
  the model's steady state, each measured: the failures' realized rate (wall time over failures: a draw of a few
  exponential gaps is not their mean) and the first launch's start-up (paid once, not after a failure); and the
  spread of the model's process over campaigns of the same length (2,000 simulated at the realized rate,
  results/goodput.py campaign_spread): one campaign's measurement is one draw of it.
- Launches whose median step was over 3 times the campaign's (other work on the machine) are outside the model's one
  step time: the last column counts them and checks the model on the other launches alone (campaign_model `steady`).
- The machine's load matters (2 shared cores): every launch says when it was busy.

Usage: <python> -m benchmarks.goodput [duration=SECONDS] [out=DIR]    measure, then print the table
       <python> -m benchmarks.goodput report [out=DIR]                 the table again from the campaigns' files
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MTBFS_S = (20, 40, 80)
SAVE_INTERVAL = 10
FAILURES_AT_FIRST_RATE = 12  # the first rate's campaigns run long enough for this many failures on average
ENGINES = ("default", "lazy")
BRACKET = (0.25, 1, 4)


def campaign(out: Path, engine: str, mtbf: int, duration: int, save_interval: int) -> dict:
    """One campaign: its folder (the last line it prints), or the reason it failed."""
    cmd = [str(REPO / "submit-job.sh"), "endure", "tiny", f"engine={engine}", f"mtbf={mtbf}",
           f"duration={duration}", f"save_interval={save_interval}", "seed=1", "launcher=prefork",
           f"results_dir={out}"]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    if not lines or not (Path(lines[-1]) / "endure.json").is_file():
        return {"engine": engine, "mtbf_s": mtbf, "error": proc.stderr.strip().splitlines()[-1:]}
    print("\n".join(lines), file=sys.stderr, flush=True)
    return {"engine": engine, "mtbf_s": mtbf, "save_interval": save_interval, "folder": lines[-1]}


def row(r: dict) -> str:
    """One campaign's line of the table: measured and modelled goodput, and the terms between them."""
    from restart_harness.results.goodput import campaign_model

    if "folder" not in r:
        return f"| {r['engine']} | {r['mtbf_s']} | failed: {r['error']} |"
    doc = json.loads((Path(r["folder"]) / "endure.json").read_text())
    m, g = campaign_model(doc, r["save_interval"]), doc["goodput"]
    if m is None or not m["simulated_goodput"]:
        return f"| {r['engine']} | {r['mtbf_s']} | {r['save_interval']} | no model: nothing committed |"
    restarts, sim = doc["restarts"], m["simulated_goodput"]
    return (f"| {r['engine']} | {r['mtbf_s']} | {r['save_interval']} ({m['interval_seconds']:.2f} s) | "
            f"{len(doc['failures'])} ({m['realized_mtbf_seconds']:.1f} s) | {restarts['verified']}/"
            f"{restarts['launched']} | {'yes' if doc['final_state']['equal'] else 'NO'} | "
            f"{m['save_seconds']:.3f} / {m['restart_seconds']:.2f} / {m['step_seconds']:.3f} | {g['goodput']:.3f} | "
            f"{m['expected_goodput']:.3f} ({m['expected_goodput'] - g['goodput']:+.3f}) | "
            f"{m['expected_goodput_realized']:.3f} ({m['expected_goodput_realized'] - g['goodput']:+.3f}) | "
            f"{sim['mean']:.3f} ({sim['p5']:.3f}-{sim['p95']:.3f}) | {m['best_interval_steps']} | {_steady(m)} |")


def _steady(m: dict) -> str:
    """The slowed launches' term: how many, and the check on the others (measured / model, the difference)."""
    if not (why := m.get("not_comparable")):
        return "none"
    st = m.get("steady")
    head = why.split(" (", 1)[0].removesuffix(" launches")
    if not st:
        return f"{head}; none other"
    return (f"{head}: {st['measured_goodput']:.3f} / {st['expected_goodput']:.3f} "
            f"({st['expected_goodput'] - st['measured_goodput']:+.3f}) on the other {st['launches']}")


def report(out: Path) -> None:
    doc = json.loads((out / "goodput-bench.json").read_text())
    print("| engine | MTBF s | interval, steps | failures (realized MTBF) | restarts verified | final = failure-free |"
          " save / restart / step s | measured goodput | model at MTBF (- measured) | model, realized rate and first"
          " start-up (- measured) | campaigns of this length, simulated: mean (90%) | model's best, steps |"
          " launches slowed 3x (of all): measured / model on the others |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in doc["rates"] + doc["bracket"]:
        print(row(r))


def main(argv: list[str]) -> int:
    args = dict(a.split("=", 1) for a in argv if "=" in a)
    bad = [a for a in argv if a != "report" and a.split("=", 1)[0] not in ("duration", "out")]
    duration = args.get("duration", "90")
    if bad or not duration.isdigit() or int(duration) < 1:
        print(f"error: {' '.join(bad) or f'duration={duration}'}: accepted: [report] [duration=SECONDS, a whole "
              "number above 0] [out=DIR]", file=sys.stderr)
        return 2
    out = Path(args.get("out", "/tmp/rh-goodput-bench")).resolve()
    if "report" in argv:
        report(out)
        return 0
    duration = int(duration)
    rows = [campaign(out, e, m, max(duration, FAILURES_AT_FIRST_RATE * m) if m == MTBFS_S[0] else duration,
                     SAVE_INTERVAL) for e in ENGINES for m in MTBFS_S]
    out.mkdir(parents=True, exist_ok=True)
    (out / "goodput-bench.json").write_text(json.dumps({"rates": rows, "bracket": []}, indent=1))
    first = next((r for r in rows if r["mtbf_s"] == MTBFS_S[0] and "folder" in r), None)
    bracket = []
    if first:
        best = json.loads((Path(first["folder"]) / "endure.json").read_text())["model"]["best_interval_steps"]
        bracket = [campaign(out, first["engine"], MTBFS_S[0], duration, max(1, round(best * f))) for f in BRACKET]
    (out / "goodput-bench.json").write_text(json.dumps({"rates": rows, "bracket": bracket}, indent=1))
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
