"""Predicted beside measured: the phases the prediction model (restart_harness/predict/) names, how each is read from
a run's summary, and the comparison every run's summary carries (`prediction`, with the crossover's side):
docs/prediction.md defines each."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from restart_harness import schema
from restart_harness.machine import BUSY_FRACTION
from restart_harness.schema import CROSSOVER_LOAD, PHASE_NAMES

LOAD_TOLERANCE = 0.15  # other work's share of the CPUs a check may differ by from its calibration's runs
FILE = "prediction.json"  # in the run directory: written before the checkpoint phase launches

SAVE_PHASES, RESTART_PHASES, TOTAL, PHASES = (schema.PREDICTED_SAVE, schema.PREDICTED_RESTART, schema.PREDICTED_TOTAL,
                                              schema.PREDICTED_PHASES)
RESTART_STEPS = ("launch", *PHASE_NAMES)


def first_restart(summary: dict) -> dict | None:
    """The run's own restart (restart-01, at the layout it saved with), or None."""
    for r in summary.get("restarts") or []:
        if r.get("record") == "restart-01" and r.get("verified") is not None:
            layout = r.get("layout") or {}
            return r if layout.get("saved") == layout.get("loaded") else None
    return None


def measured(summary: dict) -> dict[str, float | None]:
    """Every phase's measured seconds in one run's summary (None where the run has none)."""
    out: dict[str, float | None] = dict.fromkeys(PHASES)
    saves = (summary.get("checkpoint") or {}).get("saves") or []
    for phase in SAVE_PHASES:
        values = [v for s in saves if isinstance(v := s.get(phase.removeprefix("save_")), (int, float))]
        out[phase] = statistics.median(values) if values else None
    restart = first_restart(summary)
    if restart and restart.get("exit_code") == 0:
        steps = restart.get("phases") or {}
        for step, phase in zip(RESTART_STEPS, RESTART_PHASES):
            out[phase] = restart.get("launch_seconds") if step == "launch" else steps.get(step)
        if restart.get("launch_seconds") is not None and restart.get("total_seconds") is not None:
            out[TOTAL] = restart["launch_seconds"] + restart["total_seconds"]
    return out


def other_work(launch: dict | None) -> float | None:
    """The share of the machine's CPUs other work used during a launch (machine.load_since; runs before 2026-11-28
    recorded only the 0.2 s before it: that share)."""
    load = (launch or {}).get("machine_load") or {}
    during = (load.get("during") or {}).get("other_cpu_fraction")
    return during if during is not None else load.get("cpu_busy_fraction")


def not_comparable(name: str, p: dict, contention: float | None, summary: dict) -> str | None:
    """Why a measured phase is no check of its prediction: measured under other conditions than the calibration's
    runs of its group (other work's share of the CPUs beyond theirs by more than LOAD_TOLERANCE; more ranks per core
    than twice theirs); None where it is a check."""
    cond = p.get("calibrated_conditions") or {}
    other = other_work(summary.get("checkpoint") if name in SAVE_PHASES else first_restart(summary))
    lo, hi = cond.get("other_cpu_fraction") or (0.0, BUSY_FRACTION)
    taken = "" if cond.get("other_cpu_fraction") else " (its runs recorded no load: taken as a quiet machine's)"
    if other is None:
        return "the run recorded no machine load, so its conditions are unknown"
    if not lo - LOAD_TOLERANCE <= other <= hi + LOAD_TOLERANCE:
        return (f"other work used {other:.0%} of the CPUs during this launch; the calibration's runs {lo:.0%}-{hi:.0%}"
                f"{taken}")
    most = (cond.get("contention") or [None, None])[1]
    if most and contention and contention > 2 * most:
        return f"{contention:g} ranks per core, more than twice the calibration's most ({most:g})"
    return None


def read(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def compare(prediction: dict | None, summary: dict) -> dict | None:
    """The summary's `prediction`: what was predicted before launch (prediction.json) beside what was measured."""
    if not prediction:
        return None
    if prediction.get("error"):
        return {"error": prediction["error"], "phases": {}}
    seen = measured(summary)
    contention = (prediction.get("features") or {}).get("contention")
    phases = {}
    for name, p in (prediction.get("phases") or {}).items():
        m, value = seen.get(name), p.get("seconds")
        row = {"predicted": value, "low": p.get("low"), "high": p.get("high"), "bound": p.get("bound"),
               "measured": None if m is None else round(m, 6), "rel_error": None, "within_range": None}
        why = not_comparable(name, p, contention, summary) if value is not None and m else None
        if why:
            row["not_comparable"] = why
        elif value is not None and m:
            row["rel_error"] = round((value - m) / m, 4)
            if p.get("low") is not None and p.get("high") is not None:
                row["within_range"] = p["low"] <= m <= p["high"]
        phases[name] = row
    errors = [abs(r["rel_error"]) for r in phases.values() if r["rel_error"] is not None]
    return {"calibration": prediction.get("calibration"), "storage": prediction.get("storage"),
            "note": prediction.get("note"), "phases": phases,
            "median_abs_rel_error": round(statistics.median(errors), 4) if errors else None,
            "crossover": crossover_side(prediction.get("crossover"), seen, summary)}


def crossover_side(predicted: dict | None, seen: dict[str, float | None], summary: dict) -> dict | None:
    """The crossover as predicted, and `measured`: the run's checkpoint bytes, its largest measured restart phase,
    whether that is the load, and whether the prediction put the run on that side (None where not measured)."""
    if not predicted:
        return None
    restart = {p: seen.get(p) for p in RESTART_PHASES if seen.get(p) is not None}
    side = None
    if restart.get(CROSSOVER_LOAD) is not None:
        largest = max(restart, key=restart.get)
        side = {"largest_phase": largest, "load_largest": largest == CROSSOVER_LOAD,
                "side_agrees": (None if predicted.get("run_load_largest") is None
                                else predicted["run_load_largest"] == (largest == CROSSOVER_LOAD))}
    return {**predicted, "measured": {"checkpoint_bytes": (summary.get("checkpoint") or {}).get("bytes"),
                                      **(side or {"largest_phase": None, "load_largest": None, "side_agrees": None})}}
