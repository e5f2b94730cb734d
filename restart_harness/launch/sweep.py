"""Sweeps: comma lists on any key (and on MODEL) expand to their product; `repeats=N` runs each combination N
times. Every combination is validated before anything is created; then each run goes into one sweep folder
(`<results_dir>/sweep-<time>/NNN-<run>`), `sweep.json` records each combination, its run directory, state and
reason, and a failing combination is recorded and the sweep goes on."""

from __future__ import annotations

import dataclasses
import sys
import time
from datetime import datetime
from pathlib import Path

from restart_harness.command.parse import SweepRequest
from restart_harness.errors import RunFailed
from restart_harness.results.schema import SWEEP_SCHEMA_VERSION
from restart_harness.storage.atomic import make_fresh_dir, write_json_atomic


def new_sweep_dir(results_dir: str) -> Path:
    try:
        return make_fresh_dir(Path(results_dir), f"sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    except FileExistsError as exc:
        raise RunFailed(str(exc)) from None


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / total)
    return "#" * filled + "." * (width - filled)


def run(request: SweepRequest) -> Path:
    """Run every combination x repeat in order into one sweep folder; returns it. Never stops on a failure."""
    from restart_harness.launch import runner
    from restart_harness.results.status import observed

    tokens, lists, combos = request.tokens, request.lists, request.combos
    sweep_dir = new_sweep_dir(combos[0].spec.results_dir)
    runs = []
    for combo in combos:
        for rep in range(1, combo.spec.repeats + 1):
            runs.append({"index": len(runs) + 1, "combination": combo.values, "repeat": rep,
                         "repeats": combo.spec.repeats, "command": combo.tokens, "run_dir": None,
                         "state": "pending", "reason": None})
    sweep = {"schema_version": SWEEP_SCHEMA_VERSION, "sweep_id": sweep_dir.name, "command": tokens, "lists": lists,
             "state": "running", "started": time.time(), "finished": None, "runs": runs}
    write_json_atomic(sweep_dir / "sweep.json", sweep)
    total = len(runs)
    by_index = [combo for combo in combos for _ in range(combo.spec.repeats)]
    try:
        for entry, combo in zip(runs, by_index):
            label = " ".join(f"{k}={v}" for k, v in entry["combination"].items()) or "(one combination)"
            rep = f", repeat {entry['repeat']}/{entry['repeats']}" if entry["repeats"] > 1 else ""
            print(f"[sweep {entry['index']}/{total} {_bar(entry['index'] - 1, total)}] {label}{rep}",
                  file=sys.stderr, flush=True)
            entry["state"] = "running"
            write_json_atomic(sweep_dir / "sweep.json", sweep)
            spec = dataclasses.replace(combo.spec, results_dir=str(sweep_dir))
            try:
                entry["run_dir"] = str(runner.run(spec, prefix=f"{entry['index']:03d}-"))
                entry["state"] = observed(Path(entry["run_dir"]))["state"]
            except RunFailed as exc:
                entry["state"], entry["reason"] = "failed", str(exc)
            except Exception as exc:  # noqa: BLE001 - one broken combination must not end the sweep
                entry["state"], entry["reason"] = "failed", f"{type(exc).__name__}: {exc}"
            if entry["run_dir"] is None:
                made = sorted(sweep_dir.glob(f"{entry['index']:03d}-*"))
                entry["run_dir"] = str(made[-1]) if made else None
            write_json_atomic(sweep_dir / "sweep.json", sweep)
            print(f"[sweep {entry['index']}/{total} {_bar(entry['index'], total)}] {entry['state']}"
                  + (f": {entry['reason']}" if entry["reason"] else ""), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        for entry in runs:
            if entry["state"] in ("pending", "running"):
                entry["state"], entry["reason"] = "skipped", "sweep interrupted"
        sweep["state"] = "interrupted"
        raise
    finally:
        if sweep["state"] == "running":
            sweep["state"] = "complete"
        sweep["finished"] = time.time()
        sweep["counts"] = {s: sum(1 for r in runs if r["state"] == s) for s in sorted({r["state"] for r in runs})}
        write_json_atomic(sweep_dir / "sweep.json", sweep)
    return sweep_dir


def render(sweep: dict) -> str:
    """One line per run: index, state, run directory name, reason."""
    lines = [f"sweep {sweep['sweep_id']}: {', '.join(f'{n} {s}' for s, n in sweep['counts'].items())}"]
    for r in sweep["runs"]:
        name = Path(r["run_dir"]).name if r["run_dir"] else "-"
        lines.append(f"  {r['index']:>3}  {r['state']:<9} {name}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return "\n".join(lines)
