"""Sweeps: comma lists on any key (and on MODEL) expand to their product; `repeats=N` runs each combination N
times. Every combination is validated before anything is created; then each run goes into one sweep folder
(`<results_dir>/sweep-<time>/NNN-<run>`), `sweep.json` records each combination, its run directory, state and
reason, and a failing combination is recorded and the sweep goes on."""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import datetime
from pathlib import Path

from restart_harness import preflight
from restart_harness.command.requests import SweepRequest
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic
from restart_harness.files.exclusive import claim_dir
from restart_harness.phases import say
from restart_harness.phases.run import run as run_one
from restart_harness.plan.estimate import duration, size_text
from restart_harness.predict import forecast
from restart_harness.rundir.status import observed
from restart_harness.schema import SWEEP_SCHEMA_VERSION, count


def new_dir(results_dir: str, kind: str) -> Path:
    """A new campaign folder, `<results_dir>/<kind>-<time>` (sweep, study, endure), claimed by this process."""
    try:
        return claim_dir(Path(results_dir), f"{kind}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    except FileExistsError as exc:
        raise RunFailed(str(exc)) from None


def made_run_dir(folder: Path, index: int) -> str | None:
    """The run folder the campaign's run `index` made (NNN-<run>), where the run ended before saying it."""
    made = sorted(folder.glob(f"{index:03d}-*"))
    return str(made[-1]) if made else None


def clock(seconds: float) -> str:
    """plan/estimate.py's duration, without a ".0": "2 min", "10.5 h"."""
    return duration(seconds).replace(".0 ", " ")


def fixed(value: float | None, digits: int = 3) -> str:
    """A table's figure to `digits` decimals; "-" where there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / total)
    return "#" * filled + "." * (width - filled)


def estimate(plugins) -> tuple[float | None, int]:
    """(predicted wall seconds of one run, or None; the bytes of every checkpoint it keeps), from the calibration in
    force and the planner; before anything starts. A prediction that fails is no estimate, never an error."""
    if not plugins.stack.planned:
        return None, 0
    nbytes = preflight.planned_bytes(plugins)
    try:
        made = forecast.build(plugins, os.cpu_count() or 1, forecast.storage(plugins))
        return forecast.run_wall_seconds(plugins, made), nbytes
    except Exception:  # noqa: BLE001 - an estimate must never stop a sweep
        return None, nbytes


def run(request: SweepRequest) -> Path:
    """Run every combination x repeat in order into one sweep folder; returns it. Never stops on a failure."""
    combos = request.combos
    sweep_dir = new_dir(combos[0].spec.results_dir, "sweep")
    repeats = [(combo, rep) for combo in combos for rep in range(1, combo.spec.repeats + 1)]
    runs = [{"index": i, "combination": combo.values, "repeat": rep, "repeats": combo.spec.repeats,
             "command": combo.tokens, "run_dir": None, "state": "pending", "reason": None}
            for i, (combo, rep) in enumerate(repeats, 1)]
    sweep = {"schema_version": SWEEP_SCHEMA_VERSION, "sweep_id": sweep_dir.name, "command": request.tokens,
             "lists": request.lists, "state": "running", "started": time.time(), "finished": None, "runs": runs}
    write_json_atomic(sweep_dir / "sweep.json", sweep)
    by_index = [combo for combo, _ in repeats]
    predicted = _announce(sweep, combos, by_index)
    started = time.time()
    try:
        for entry, combo in zip(runs, by_index):
            _run_entry(sweep_dir, sweep, entry, combo, lambda done: _times(started, done, predicted))
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


def _announce(sweep: dict, combos: list, by_index: list) -> list[float | None]:
    """Print and record the sweep's estimate (time, checkpoint bytes kept); returns each run's predicted seconds."""
    total = len(by_index)
    guesses = {id(c): estimate(c.plugins) for c in combos}
    predicted = [guesses[id(c)][0] for c in by_index]
    nbytes = sum(guesses[id(c)][1] for c in by_index)
    known = [p for p in predicted if p is not None]
    said = (f"about {clock(sum(known))}" + (f" for the {count(len(known), 'run')} predicted" if len(known) < total else "")
            + f" (calibration {combos[0].spec.calibration})") if known else "no time estimate (nothing predicted)"
    dry = (f"{count(total, 'dry run')}, nothing launched; run for real they would take" if combos[0].spec.dry_run
           else f"{count(total, 'run')}:")
    say(f"[sweep] {dry} {said}; {size_text(nbytes)} of checkpoints kept")
    sweep["estimate"] = {"wall_seconds": round(sum(known), 1) if known else None, "runs_predicted": len(known),
                         "checkpoint_bytes": nbytes}
    return predicted


def _run_entry(sweep_dir: Path, sweep: dict, entry: dict, combo, times) -> None:
    """One run of the sweep into its folder, its state and reason recorded; `times(done)` the progress's clock."""
    total, index = len(sweep["runs"]), entry["index"]
    label = " ".join(f"{k}={v}" for k, v in entry["combination"].items()) or "(one combination)"
    rep = f", repeat {entry['repeat']}/{entry['repeats']}" if entry["repeats"] > 1 else ""
    say(f"[sweep {index}/{total} {_bar(index - 1, total)}] {label}{rep}" + times(index - 1))
    entry["state"] = "running"
    write_json_atomic(sweep_dir / "sweep.json", sweep)
    plugins = combo.plugins.with_spec(dataclasses.replace(combo.spec, results_dir=str(sweep_dir)))
    try:
        entry["run_dir"] = str(run_one(plugins, prefix=f"{index:03d}-"))
        entry["state"] = observed(Path(entry["run_dir"]))["state"]
    except Exception as exc:  # noqa: BLE001 - one broken combination must not end the sweep
        why = str(exc) if isinstance(exc, RunFailed) else f"{type(exc).__name__}: {exc}"
        entry["state"], entry["reason"] = "failed", why
    entry["run_dir"] = entry["run_dir"] or made_run_dir(sweep_dir, index)
    write_json_atomic(sweep_dir / "sweep.json", sweep)
    say(f"[sweep {index}/{total} {_bar(index, total)}] {entry['state']}"
        + (f": {entry['reason']}" if entry["reason"] else "") + times(index))


def _times(started: float, done: int, predicted: list[float | None]) -> str:
    """"; elapsed 2 min, ~6 min left": the time left from the runs done so far (their mean, measured) once one is,
    else from the prediction."""
    elapsed = time.time() - started
    left = len(predicted) - done
    said = f"; elapsed {clock(elapsed)}"
    if not left or (not done and None in predicted):
        return said
    return f"{said}, ~{clock(elapsed / done * left if done else sum(predicted))} left"


def render(sweep: dict) -> str:
    """One line per run: index, state, run directory name, reason."""
    lines = [f"sweep {sweep['sweep_id']}: {', '.join(f'{n} {s}' for s, n in sweep['counts'].items())}"]
    for r in sweep["runs"]:
        name = Path(r["run_dir"]).name if r["run_dir"] else "-"
        lines.append(f"  {r['index']:>3}  {r['state']:<9} {name}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return "\n".join(lines)
