"""The crossover (docs/prediction.md#the-crossover: the family of runs, the definition, the statuses): the checkpoint
size at which the checkpoint load becomes the largest phase of a restart, from the prediction model's own phases,
found on a log grid of the range, then by bisection to a relative 1e-9."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from restart_harness.predict.features import Features
from restart_harness.predict.model import predict
from restart_harness.resolve import Plugins
from restart_harness.results.prediction import RESTART_PHASES
from restart_harness.schema import CROSSOVER_LOAD, CROSSOVER_RANGE_BYTES, GIB, MIB, span

MIN_BYTES, MAX_BYTES = CROSSOVER_RANGE_BYTES  # 1 MiB - 1 PiB (the largest Size a key takes)
GRID_PER_DECADE = 24  # where the load is largest is one interval when every phase is linear in B: finer is not needed
CURVE_PER_DECADE = 4  # points kept for the report's figure
BISECTIONS = 100  # far more than a relative 1e-9 needs: the loop stops there
_SCALED = ("save_bytes", "save_bytes_max_rank", "save_bytes_at_once", "save_core_bytes", "read_bytes",
           "read_bytes_max_rank", "read_bytes_at_once", "read_core_bytes")


def scaled(f: Features, checkpoint_bytes: float) -> Features:
    """The run's features with its model grown (or shrunk) to a checkpoint of checkpoint_bytes: parameters and every
    byte figure in proportion; files, ranks, tokens per step and the storage as they are."""
    s = checkpoint_bytes / f.save_bytes
    return replace(f, parameters_per_rank=f.parameters_per_rank * s, **{k: getattr(f, k) * s for k in _SCALED})


def phases_at(plugins: Plugins, f: Features, calibration: dict, checkpoint_bytes: float) -> dict[str, float | None]:
    """Every restart phase the run has, predicted for the member of its family with a checkpoint of that size."""
    made = predict(plugins, scaled(f, checkpoint_bytes), calibration)["phases"]
    return {p: made[p]["seconds"] for p in RESTART_PHASES if not made[p].get("absent")}


def _largest(seconds: dict[str, float]) -> str:
    """The largest phase; the load only where it is larger than every other (a tie is not a crossing)."""
    others = {p: s for p, s in seconds.items() if p != CROSSOVER_LOAD}
    top = max(others, key=others.get)
    return CROSSOVER_LOAD if seconds[CROSSOVER_LOAD] > others[top] else top


def _grid(low: float, high: float, per_decade: int) -> list[float]:
    n = max(1, math.ceil(math.log10(high / low) * per_decade))
    return [low * (high / low) ** (i / n) for i in range(n + 1)]


def _edge(is_load: Callable[[float], bool], below: float, above: float) -> float:
    """Where is_load turns from is_load(below) to is_load(above), to a relative 1e-9 (log bisection)."""
    start = is_load(below)
    for _ in range(BISECTIONS):
        if above / below - 1 < 1e-9:
            break
        mid = math.sqrt(below * above)
        if is_load(mid) == start:
            below = mid
        else:
            above = mid
    return above


def compute(plugins: Plugins, f: Features, calibration: dict, low: int = MIN_BYTES, high: int = MAX_BYTES) -> dict:
    """The crossover of the run's family in [low, high] bytes of checkpoint, with the curve the report draws, the run's
    own side and a short explanation (render)."""
    out: dict = {"crossover_checkpoint_bytes": None, "range_checkpoint_bytes": [low, high],
                 "run_checkpoint_bytes": f.save_bytes}
    if not f.save_bytes:
        return {**out, "status": "no_checkpoint", "why": f"engine {plugins.spec.engine} writes no checkpoint"}
    at_run = phases_at(plugins, f, calibration, f.save_bytes)
    missing = [p for p, s in at_run.items() if s is None]
    if missing or CROSSOVER_LOAD not in at_run:
        return {**out, "status": "not_predicted",
                "why": f"not predicted: {', '.join(missing or [CROSSOVER_LOAD])} (see its line)"}

    def seconds(b: float) -> dict[str, float]:
        return phases_at(plugins, f, calibration, b)  # type: ignore[return-value] - every phase is predicted

    def is_load(b: float) -> bool:
        return _largest(seconds(b)) == CROSSOVER_LOAD

    grid = _grid(low, high, GRID_PER_DECADE)
    sides = [is_load(b) for b in grid]
    run_largest = _largest(at_run)
    out.update(run_largest_phase=run_largest, run_load_largest=run_largest == CROSSOVER_LOAD,
               curve=_curve(seconds, low, high))
    if sides[0]:
        out.update(status="already_largest", largest_at_min=CROSSOVER_LOAD)
    elif not any(sides):
        out.update(status="never_largest", largest_at_max=_largest(seconds(high)))
    else:
        i = sides.index(True)
        cross = _edge(is_load, grid[i - 1], grid[i])
        out.update(status="crosses", crossover_checkpoint_bytes=round(cross),
                   overtakes=_largest(seconds(cross / (1 + 1e-6))), seconds_at_crossover=seconds(cross))
        if False in sides[i:]:  # another phase outgrows the load again
            j = sides.index(False, i)
            out["load_largest_until_bytes"] = round(_edge(is_load, grid[j - 1], grid[j]))
    where = out.get("crossover_checkpoint_bytes") or f.save_bytes
    out["seconds_per_gib"] = {p: round((seconds(2 * where)[p] - seconds(where)[p]) / (where / GIB), 6)
                              for p in at_run}
    out["explanation"] = explain(out, f)
    return out


def _curve(seconds: Callable[[float], dict], low: float, high: float) -> dict:
    points = _grid(low, high, CURVE_PER_DECADE)
    rows = [seconds(b) for b in points]
    return {"checkpoint_bytes": [round(b) for b in points],
            "seconds": {p: [r[p] for r in rows] for p in rows[0]}}


def size(b: float) -> str:
    """Bytes as people read them: GiB from 0.01 GiB to 1 TiB (the unit the docs promise), MiB below, TiB and PiB
    above."""
    for unit, n in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", GIB)):
        if b >= n or (unit == "GiB" and b >= GIB / 100):
            return f"{b / n:,.2f} {unit}"
    return f"{b / MIB:,.2f} MiB"


def short(phase: str) -> str:
    return phase.removeprefix("restart_").removesuffix("_seconds")


def headline(c: dict) -> str:
    """The crossover in one line."""
    b = c.get("crossover_checkpoint_bytes")
    lo, hi = (size(x) for x in c["range_checkpoint_bytes"])
    if c["status"] == "crosses":
        until = c.get("load_largest_until_bytes")
        return (f"checkpoint load largest from {size(b)} ({b:,} bytes) of checkpoint on, overtaking "
                f"{short(c['overtakes'])}" + (f", until {size(until)}" if until else ""))
    if c["status"] == "already_largest":
        return f"none in {span(lo, hi)}: the checkpoint load is the largest phase already at {lo}"
    if c["status"] == "never_largest":
        return (f"none in {span(lo, hi)}: the checkpoint load is never the largest phase; "
                f"{short(c['largest_at_max'])} stays above it")
    return f"none: {c['why']}"


def explain(c: dict, f: Features) -> list[str]:
    """A few lines: why there, how fast each side grows, where this run sits."""
    per = c["seconds_per_gib"]
    grow = (f"load grows {per[CROSSOVER_LOAD]:.3g} s per GiB (storage reads at "
            f"{f.read_bytes_per_s / MIB:,.0f} MiB/s and deserialization)" if f.read_bytes_per_s else
            f"load grows {per[CROSSOVER_LOAD]:.3g} s per GiB")
    lines = []
    if c["status"] == "crosses":
        at = c["seconds_at_crossover"]
        rival = c["overtakes"]
        lines.append(f"there the load and {short(rival)} both take {at[CROSSOVER_LOAD]:.3g} s; {grow}, "
                     f"{short(rival)} {per[rival]:.3g} s per GiB")
    elif c["status"] == "never_largest":
        rival = c["largest_at_max"]
        lines.append(f"{grow}, {short(rival)} {per[rival]:.3g} s per GiB")
    else:
        lines.append(grow)
    run = c["run_checkpoint_bytes"]
    if c["run_load_largest"]:
        lines.append(f"this run's checkpoint ({size(run)}) is past it: the load is its largest predicted phase")
    else:
        lines.append(f"this run's checkpoint ({size(run)}): {short(c['run_largest_phase'])} is its largest predicted "
                     "phase")
    lines.append("the family: this run with its model's size changed (parameters and bytes in proportion; layout, "
                 "files, tokens per step and storage kept): docs/prediction.md#the-crossover")
    return lines
