"""Calibration: the model's coefficients fitted from finished runs (`./submit-job.sh calibrate runs=DIR`), and the
calibration file they are kept in (configs/calibration/*.json, docs/prediction.md).

Each phase and group is fitted by non-negative least squares on relative errors: minimise
sum_runs ((predicted - measured) / measured)^2 over coefficients >= 0, by solving the least squares of every subset
of the phase's terms and keeping the best whose coefficients are all non-negative (at most eight terms: 255 subsets).
A run contributes to the phases it measured; a run without its storage's bandwidth (baseline=false) contributes to
the phases whose terms do not need it."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np

from restart_harness import resolve
from restart_harness.errors import UsageError, refused
from restart_harness.files import baseline
from restart_harness.files.exclusive import create_json
from restart_harness.predict import features as feats
from restart_harness.predict.model import PHASES, Phase
from restart_harness.results.prediction import SAVE_PHASES, first_restart, measured, other_work
from restart_harness.rundir.status import find_run_dirs
from restart_harness.schema import MIB, span

SCHEMA_VERSION = 1
CALIBRATIONS = Path(__file__).resolve().parents[2] / "configs" / "calibration"


def path_of(name: str) -> Path:
    """A calibration by name (configs/calibration/NAME.json) or by path."""
    return Path(name) if name.endswith(".json") or "/" in name else CALIBRATIONS / f"{name}.json"


def load(name: str, key: str = "calibration") -> dict:
    path = path_of(name)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        known = ", ".join(sorted(p.stem for p in CALIBRATIONS.glob("*.json")))
        raise UsageError(f"{key}={name}: not a readable calibration file ({type(exc).__name__}); accepted: "
                         f"{known}, or a path to a file ./submit-job.sh calibrate wrote") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION or "phases" not in data:
        raise UsageError(f"{key}={name}: {path} is not a calibration (schema_version {SCHEMA_VERSION})")
    return data


def nonnegative_fit(x: list[list[float]], y: list[float], given: list[float] | None = None) -> list[float]:
    """Coefficients >= 0 minimising the sum of squared relative errors ((x.c + given - y) / y)^2 (y > 0), where
    `given` is the part of each y that is not fitted (the storage's own time; zero if None)."""
    k = len(x[0])
    given = given or [0.0] * len(y)
    scaled = [[v / t for v in row] for row, t in zip(x, y)]
    target = [(t - g) / t for t, g in zip(y, given)]
    # columns scaled to unit norm so that features in bytes and in ranks meet on equal terms
    norms = [max(sum(r[i] ** 2 for r in scaled) ** 0.5, 1e-300) for i in range(k)]
    unit = [[v / n for v, n in zip(row, norms)] for row in scaled]
    best, best_err = [0.0] * k, sum(t * t for t in target)  # all zero: the given part alone
    for size in range(1, k + 1):
        for subset in itertools.combinations(range(k), size):
            if len(y) < size:
                continue
            sub = np.asarray([[row[i] for i in subset] for row in unit], dtype=float)
            sol, _, rank, _ = np.linalg.lstsq(sub, np.asarray(target, dtype=float), rcond=None)
            if rank < size or min(sol) < 0:  # linearly dependent columns, or a negative coefficient
                continue
            coef = [0.0] * k
            for i, c in zip(subset, sol.tolist()):
                coef[i] = c / norms[i]
            err = sum((sum(c * v for c, v in zip(coef, row)) - t) ** 2 for row, t in zip(scaled, target))
            if err < best_err - 1e-12:
                best, best_err = coef, err
    return best


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    if len(values) < 5:
        return values[0] if q < 0.5 else values[-1]
    pos = q * (len(values) - 1)
    lo = int(pos)
    return values[lo] + (values[min(lo + 1, len(values) - 1)] - values[lo]) * (pos - lo)


def run_dirs(paths: list[Path]) -> list[Path]:
    """Every finished run directory under the given folders (a run directory holding summary.json)."""
    return sorted({d.resolve() for p in paths for d in find_run_dirs(Path(p)) if (d / "summary.json").is_file()})


def observation(run_dir: Path) -> dict | None:
    """One finished run as the fit sees it: its spec, features and measured phases (None: not usable, and why)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:  # a half-written or foreign summary.json: that run is skipped, with why
        return {"run": str(run_dir), "skipped": f"summary.json unreadable ({exc})"}
    if not isinstance(summary, dict):
        return {"run": str(run_dir), "skipped": "summary.json is not an object"}
    if (summary.get("status") or {}).get("state") != "complete":
        return {"run": str(run_dir), "skipped": f"state {(summary.get('status') or {}).get('state')}"}
    try:
        run = resolve.read(run_dir)
    except UsageError as exc:
        return {"run": str(run_dir), "skipped": str(exc)}
    if not run.stack.planned:
        return {"run": str(run_dir), "skipped": f"stack={run.spec.stack}: the planner does not plan its files"}
    write, read, _ = baseline.bandwidths_mib_s(summary.get("baseline"))
    write, read = write and write * MIB, read and read * MIB
    cpus = (run.facts.get("host") or {}).get("cpus") or 1
    saves = (summary.get("checkpoint") or {}).get("saves") or []
    f = feats.of(run, cpus, write or None, read or None)
    return {"run": str(run_dir), "plugins": run, "features": f, "measured": measured(summary),
            "asynchronous": any(s.get("async") for s in saves), "conditions": conditions(summary, f.contention),
            "device": recorded_device(run.spec.device, run.facts.get("host") or {})}


def conditions(summary: dict, contention: float) -> dict:
    """What a run's phases were measured under: ranks per core (the model's contention) and the share of the CPUs
    other work used during its checkpoint launch (the saves) and its restart's (the restart phases)."""
    return {"contention": contention, "save_other_cpu_fraction": other_work(summary.get("checkpoint")),
            "restart_other_cpu_fraction": other_work(first_restart(summary))}


def recorded_device(device: str, host: dict) -> dict:
    """The device a run computed on, from its spec.json (its model: null in runs before 2026-11-26)."""
    if device == "cuda":
        return {"kind": "cuda", "model": host.get("gpu_model"), "count": host.get("gpus")}
    return {"kind": "cpu", "model": host.get("cpu_model"), "count": host.get("cpus")}


def device_label(d: dict) -> str:
    """`cpu: AMD EPYC ... (2)`, `cuda: NVIDIA H200 (8)`: a device as a calibration and a prediction name it."""
    return f"{d['kind']}: {d.get('model') or 'model not recorded'}" + (f" ({d['count']})" if d.get("count") else "")


def same_device(calibration: dict, device: dict) -> bool:
    """Was the calibration measured on this kind of device (the same model, where both name one)? A calibration
    older than the record of its devices was measured on this project's CPU machines."""
    devices = calibration.get("devices") or [{"kind": "cpu", "model": None}]
    return any(d["kind"] == device["kind"] and (not d.get("model") or not device.get("model")
                                                or d["model"] == device["model"]) for d in devices)


def _fit_phase(phase: Phase, observations: list[dict]) -> dict:
    groups: dict[str, list] = {}
    seen: dict[str, int] = {}
    for o in observations:
        group = phase.group(o["plugins"])
        seen[group] = seen.get(group, 0) + 1
        y = o["measured"].get(phase.name)
        if not y or y <= 0:
            continue
        x = [t.value(o["features"]) for t in phase.terms]
        if any(v is None for v in x):
            continue
        load = o["conditions"]["save_other_cpu_fraction" if phase.name in SAVE_PHASES else "restart_other_cpu_fraction"]
        groups.setdefault(group, []).append((x, y, o["run"], o["asynchronous"], (o["features"].contention, load)))
    fitted = {}
    for group, n in sorted(seen.items()):
        if group not in groups and not any(o["measured"].get(phase.name) for o in observations
                                           if phase.group(o["plugins"]) == group):
            fitted[group] = {"absent": True, "runs": n}  # no run of this group has the phase (emulated: no model)
    for group, rows in sorted(groups.items()):
        given_names = phase.given + (phase.given_if_synchronous if not any(r[3] for r in rows) else ())
        given_at = [i for i, t in enumerate(phase.terms) if t.name in given_names]
        free = [i for i in range(len(phase.terms)) if i not in given_at]
        given = [sum(x[i] for i in given_at) for x, *_ in rows]
        coef_free = nonnegative_fit([[x[i] for i in free] for x, *_ in rows], [r[1] for r in rows], given)
        by_free = dict(zip(free, coef_free))
        coef = [1.0 if i in given_at else by_free[i] for i in range(len(phase.terms))]
        ratios = [y / max(sum(c * v for c, v in zip(coef, x)), 1e-12) for x, y, *_ in rows]
        errors = [abs(1 / r - 1) for r in ratios]
        fitted[group] = {
            "coefficients": {t.name: c for t, c in zip(phase.terms, coef) if c > 0},
            "calibrated_range": {t.name: [min(r[0][i] for r in rows), max(r[0][i] for r in rows)]
                                 for i, t in enumerate(phase.terms)
                                 if coef[i] > 0 and t.name != "fixed" and i not in given_at},
            "ratio_range": [round(_quantile(ratios, 0.1), 4), round(_quantile(ratios, 0.9), 4)],
            "runs": len(rows), "given": [t for t in given_names if t in {term.name for term in phase.terms}],
            "median_abs_rel_error": round(statistics.median(errors), 4),
            "conditions": _span_of([r[4] for r in rows])}
    return fitted


def _span_of(conds: list[tuple[float, float | None]]) -> dict:
    """The conditions a group's runs were measured under: ranks per core and other work's share of the CPUs, each
    [least, most] (None where no run recorded it)."""
    loads = [c[1] for c in conds if c[1] is not None]
    return {"contention": [min(c[0] for c in conds), max(c[0] for c in conds)],
            "other_cpu_fraction": [min(loads), max(loads)] if loads else None}


def calibrate(paths: list[Path], device: str = "all", base: dict | None = None) -> dict:
    """Fit every phase from the finished runs under `paths` (with device=cpu|cuda: its runs only, a calibration
    made on a GPU cluster brought in from its runs' folders); the calibration as plain data. With `base`, a
    calibration whose groups are kept: these runs' fits add the groups it lacks."""
    dirs = run_dirs(paths)
    if not dirs:
        raise UsageError(f"runs={','.join(map(str, paths))}: no finished run directory (summary.json) there")
    seen = [observation(d) for d in dirs]
    used = [o for o in seen if "skipped" not in o]
    if device != "all":
        kinds = sorted({o["device"]["kind"] for o in used})
        used = [o for o in used if o["device"]["kind"] == device]
        if not used:
            raise refused("runs", ",".join(map(str, paths)), f"none of its {len(dirs)} runs computed on device="
                          f"{device} (they computed on {', '.join(kinds) or 'nothing usable'})",
                          f"folders of runs made on {device} (their spec.json's device), or device=all")
    if not used:
        raise refused("runs", ",".join(map(str, paths)), f"none of the {len(dirs)} runs can be used "
                      f"({seen[0]['skipped']}, ...)")
    hosts = {(o["features"].cpus_per_node) for o in used}
    devices = {json.dumps(o["device"], sort_keys=True): o["device"] for o in used}
    made = {
        "schema_version": SCHEMA_VERSION, "fitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus_per_node": sorted(hosts)},
        # the devices its runs computed on: a prediction for another says so beside every figure (forecast.py)
        "devices": [devices[k] for k in sorted(devices)],
        "definition": "phase_seconds = sum of coefficient x term; ratio_range: the 10th and 90th percentiles of "
                      "measured / fitted over these runs (min and max under 5 runs); conditions: the ranks per core "
                      "and the share of the CPUs other work used while its runs ran; docs/prediction.md",
        "runs": [o["run"] for o in used], "skipped": {o["run"]: o["skipped"] for o in seen if "skipped" in o},
        "phases": {name: _fit_phase(phase, used) for name, phase in PHASES.items()}}
    return made if base is None else _onto(base, made)


def _onto(base: dict, made: dict) -> dict:
    """`made`'s groups added to `base` where it lacks them (base's groups kept as they were fitted)."""
    out = {**made, "based_on": base.get("fitted_at"), "runs": [*base.get("runs", []), *made["runs"]],
           "machine": {"cpus_per_node": sorted({*base.get("machine", {}).get("cpus_per_node", []),
                                                *made["machine"]["cpus_per_node"]})},
           "devices": base.get("devices") or [{"kind": "cpu", "model": None}]}
    out["devices"] += [d for d in made["devices"] if d not in out["devices"]]
    out["phases"] = {name: {**groups, **base["phases"].get(name, {})} for name, groups in made["phases"].items()}
    return out


def write(calibration: dict, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return create_json(out, calibration)  # FileExistsError where another process wrote it meanwhile


def render(calibration: dict) -> str:
    """Each phase and group: its runs, fitted coefficients and how well they fit those runs."""
    lines = [f"calibration from {len(calibration['runs'])} runs ({len(calibration['skipped'])} skipped) on "
             + "; ".join(device_label(d) for d in calibration.get("devices") or []), "",
             f"{'phase':<34}{'group':<22}{'runs':>5}{'median |err|':>14}{'range':>16}  coefficients"]
    for name, groups in calibration["phases"].items():
        for group, g in groups.items():
            if g.get("absent"):
                lines.append(f"{name:<34}{group:<22}{g['runs']:>5}  not a phase of these runs")
                continue
            coef = ", ".join(f"{k} {v:.3g}" for k, v in g["coefficients"].items()) or "none (all zero)"
            ratios = span(f"x{g['ratio_range'][0]:.2f}", f"x{g['ratio_range'][1]:.2f}")
            load = (g.get("conditions") or {}).get("other_cpu_fraction")
            under = f"; other work {load[0]:.0%}-{load[1]:.0%} of the CPUs" if load else ""
            lines.append(f"{name:<34}{group:<22}{g['runs']:>5}{g['median_abs_rel_error']:>13.1%}{ratios:>16}  {coef}"
                         + under)
    for run, why in calibration["skipped"].items():
        lines.append(f"skipped {run}: {why}")
    return "\n".join(lines)
