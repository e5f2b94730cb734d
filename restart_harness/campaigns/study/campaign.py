"""The study as a campaign: checked and sized before anything is created (every refusal made), recorded in its
study.json and printed; its runs are made by running.py (docs/study.md#resumable-and-safe)."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from restart_harness import machine, preflight, resolve
from restart_harness.campaigns import outcome
from restart_harness.campaigns.study import sizing as sizes
from restart_harness.campaigns.study.cells import Cell, Option, build_cells, study_device
from restart_harness.command.requests import StudyRequest
from restart_harness.errors import UsageError
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.files.exclusive import hold
from restart_harness.phases import say
from restart_harness.plan.estimate import size_text
from restart_harness.schema import STUDY, STUDY_SCHEMA_VERSION

# What a study spends outside its runs, measured here (2 cores): planning ~0.1 s a cell; writing the table and its
# figures (matplotlib imported, five PNGs) 10-20 s.
REPORT_SECONDS = 30.0
KEEP_FREE_BYTES = 10 * 2**30  # disk='s default: the free space but this much, or half of it where that is more


# ---- the study: checked, sized, run ------------------------------------------------------------------------------
@dataclass
class Study:
    request: StudyRequest
    cells: list[Cell]
    notes: list[str]
    sizing: sizes.Sizing
    started: float  # time.time() when the command started
    planning_seconds: float
    load: dict  # machine.load_now() when the study was sized
    target: dict  # what the cells' real-size predictions are for (target_of)
    folder: Path | None = None  # resume=: the study's folder; else made when it starts
    previous: dict | None = None  # resume=: the study.json it continues
    state: str = "running"
    ratios: list[float] = field(default_factory=list)  # run wall seconds / estimate, the runs so far

    @property
    def deadline(self) -> float:
        """When the last run must have ended: the time limit less the table's own time."""
        return self.started + self.request.options.time_limit * 60 - REPORT_SECONDS

    def to_run(self) -> list[Cell]:
        return [c for c in self.cells if c.state in ("pending", "running", "interrupted")
                or (c.state == "planned" and c.option.time_bound)]


def prior_factor(load: dict) -> float:
    """Run wall seconds over the calibration's estimate before any run here: 1 on a quiet machine, more as other
    work shares its CPUs (corrected by every run: Study.ratios)."""
    return round(1.0 + (load.get("loadavg_1min") or 0.0) / max(1, load.get("cpus") or 1), 2)


def check(request: StudyRequest) -> Study:
    """Every cell planned and predicted, the runs sized (projected: each is sized again before it starts), every
    refusal made - before anything is created."""
    started = time.time()
    o = request.options
    cells, notes = build_cells(request)
    previous = _previous(request, cells)
    sample = resolve.plugins(cells[0].spec)
    preflight.paths(sample)
    local = not sample.launcher.submits()
    cpus = request.predict.cpus_per_node or os.cpu_count() or 1
    store = sizes.storage(request, cells, measure=False)
    device = study_device(request)
    target = target_of(request, device)
    sizes.predict_cells(cells, store, target)
    for cell in cells:  # runs_here: None where the cell's engine can run on this machine's device, else why not
        try:
            resolve.plugins(dataclasses.replace(cell.spec, device=device)).engine.check()
        except UsageError as exc:
            cell.runs_here = str(exc)
    free = sample.target.storage_probe().free_bytes() or 0
    disk = o.disk or max(1, free // 2, free - KEEP_FREE_BYTES)
    load = machine.load_now()
    ratios = list(((previous or {}).get("factor") or {}).get("ratios") or [])
    factor = round(statistics.median(ratios), 2) if ratios else prior_factor(load)
    run_words = [w for w in request.run_tokens if not w.startswith("device=")] + [f"device={device}"]
    sizing = sizes.Sizing(disk, store, cpus, factor, o.fidelity, run_words, local)
    planning = time.time() - started
    study = Study(request, cells, notes, sizing, started, planning, load, target,
                  folder=Path(o.resume).expanduser() if o.resume else None, previous=previous, ratios=ratios)
    least = planning + REPORT_SECONDS
    if o.time_limit * 60 < least:
        raise UsageError(f"time_limit={o.time_limit:g} min: the planned-only table alone takes ~{sizes.clock(least)} "
                         f"here (planning {len(cells)} cells took {planning:.1f} s; the table and its figures ~"
                         f"{REPORT_SECONDS:.0f} s); accepted: time_limit >= {math.ceil(least / 6) / 10:g}")
    project(study)
    if o.fidelity not in ("auto", "predicted"):
        _check_named(study)
    if o.fidelity != "predicted":  # the cells run as single runs would: their launcher checked as a run's is
        sample.launcher.offers_dry_run = False  # a study takes no dry_run
        sample.launcher.preflight()
        if sample.scheduler:
            sample.scheduler.preflight()
    return study


def target_of(request: StudyRequest, here: str) -> dict:
    """What the cells' real-size predictions are for: the device the user names (target_device=), its GPUs per node,
    and CPUs per node (cpus_per_node=; else this machine's where the target is its device, else one a rank: ranks
    of another device are not this machine's ranks sharing its cores)."""
    device, per_node = request.options.target_device, request.options.gpus_per_node
    if request.predict.cpus_per_node:
        cpus, source = request.predict.cpus_per_node, "cpus_per_node="
    elif device == here:
        cpus, source = os.cpu_count() or 1, "this machine's"
    else:
        cpus, source = per_node, "one a rank: cpus_per_node= not given"
    return {"device": device, "gpus_per_node": per_node, "cpus_per_node": cpus, "cpus_source": source}


def _previous(request: StudyRequest, cells: list[Cell]) -> dict | None:
    """resume=: the study.json continued, its cells' states carried over (cells are matched by id)."""
    if not request.options.resume:
        return None
    folder = Path(request.options.resume).expanduser()
    if why := hold(folder):  # held until this process ends: a second resume of it is refused
        raise UsageError(f"resume={request.options.resume}: {why}")
    recorded = read_json(folder / STUDY)
    by_id = {c["id"]: c for c in recorded.get("cells", [])}
    for cell in cells:
        old = by_id.get(cell.id)
        if old is None:
            continue
        cell.state, cell.run_dir, cell.reason = old["state"], old.get("run_dir"), old.get("reason")
        cell.wall_seconds, cell.attempts = old.get("wall_seconds"), list(old.get("attempts") or [])
        o = old.get("option") or {}
        if old["state"] in ("complete", "failed", "submitted"):
            cell.option = Option(o.get("mode", "predicted"), o.get("shrink", 1), o.get("emulate", False),
                                 o.get("estimate_seconds"), o.get("bytes", 0), o.get("reason", ""))
        else:
            cell.option = Option("predicted", reason=o.get("reason", ""), why=o.get("why", ""),
                                 time_bound=old["state"] != "planned" or o.get("time_bound", False))
    return recorded


def project(study: Study) -> None:
    """Each cell's option as the run would choose it, on the clock of the estimates: what the study prints before
    it starts (each run is sized again, with the time truly left, before it starts)."""
    clock = time.time()
    sizing = study.sizing
    todo = study.to_run() if study.previous else list(study.cells)
    for cell in todo:
        cell.state = "planned"
        if cell.runs_here:
            cell.option = sizes.choose(cell, 0.0, sizing)
    coverage, rest = sizes.priority(todo)
    for i, cell in enumerate([*coverage, *rest]):
        cell.option = next_for(cell, coverage[i + 1:] if i < len(coverage) else None, study.deadline - clock, sizing)
        if cell.option.mode != "predicted":
            cell.state = "pending"
            clock += cell.option.seconds * sizing.factor


def next_for(cell: Cell, later: list[Cell] | None, time_left: float, sizing: sizes.Sizing) -> Option:
    """The cell's option as it starts: sized again against the memory available now (the runs before it, other
    work), so one that no longer fits is shrunk further, or planned and predicted only, its reason saying so."""
    sizing.cache = {k: v for k, v in sizing.cache.items() if k[0] != cell.index}
    if sizing.fidelity == "auto" and time_left < sizes.HARNESS_SECONDS * sizing.factor and not cell.runs_here:
        return Option("predicted", time_bound=True, why="no time left for a run",
                      reason="the time limit is spent by the runs before it")
    return sizes.next_option(cell, later, time_left, sizing)


def _check_named(study: Study) -> None:
    """fidelity=real|emulated|shrunk: every cell whose engine runs here gets it, or the study is refused."""
    o = study.request.options
    runs = [c for c in study.cells if c.option.mode != "predicted"]
    first = next((c for c in study.cells if c.runs_here is None), None) or study.cells[0]
    outcome.something_runs(f"fidelity={o.fidelity}", len(study.cells), len(runs),
                           f"cell {first.id}: {sizes.shorten(first.runs_here or first.option.reason, 200)}",
                           "a larger disk= or time_limit=, fidelity=auto (the most faithful option that fits, cell "
                           "by cell, else predicted), or fidelity=predicted", "cells")
    for cell in study.cells:
        if cell.runs_here is None and cell.option.mode == "predicted":
            misses = [r for r in cell.option.reason.split(sizes.REASONS)
                      if "more than disk=" in r or "not predicted" in r]
            if misses:
                raise UsageError(f"fidelity={o.fidelity}: cell {cell.id} does not fit: {misses[0]}; accepted: a larger "
                                 "disk=, fidelity=auto (the largest option that fits, cell by cell), or fewer models")
    total = sum(c.option.seconds * study.sizing.factor for c in runs)
    left = study.deadline - time.time()
    if total > left:
        raise UsageError(f"fidelity={o.fidelity}: its {len(runs)} runs would take ~{sizes.clock(total)} (the "
                         f"calibration's estimate x {study.sizing.factor:g} for this machine), more than the "
                         f"{sizes.clock(max(0, left))} time_limit={o.time_limit:g} min leaves; accepted: time_limit >= "
                         f"{math.ceil((total + time.time() - study.started + REPORT_SECONDS) / 60)}, "
                         "fidelity=auto, or fewer models, strategies or engines")


def factor_now(study: Study) -> float:
    return round(statistics.median(study.ratios), 2) if study.ratios else study.sizing.factor


# ---- records -----------------------------------------------------------------------------------------------------
def record(study: Study) -> dict:
    request, store = study.request, study.sizing.store
    return {
        "schema_version": STUDY_SCHEMA_VERSION, "study_id": study.folder.name if study.folder else None,
        "command": ["study", *request.tokens] if not request.options.resume else
        (study.previous or {}).get("command", ["study", *request.tokens]),
        "state": study.state, "started": study.started, "updated": time.time(),
        "options": dataclasses.asdict(request.options), "models": request.models, "gpu_counts": request.gpu_counts,
        "engines": request.engines, "run_keys": request.run_tokens,
        "time_limit_seconds": request.options.time_limit * 60, "planning_seconds": round(study.planning_seconds, 2),
        "machine": {"host": os.uname().nodename, "load_at_start": study.load}, "target": study.target,
        "factor": {"prior": prior_factor(study.load), "ratios": study.ratios, "now": factor_now(study)},
        "disk_bytes": study.sizing.disk, "storage": store.get("label"), "storage_source": store.get("source"),
        "storage_write_bytes_per_s": store.get("write_bytes_per_s"),
        "storage_read_bytes_per_s": store.get("read_bytes_per_s"),
        "not_placed": study.notes, "cells": [c.to_json() for c in study.cells]}


def write(study: Study) -> None:
    if study.folder is not None:
        write_json_atomic(study.folder / STUDY, record(study))


def table(study: Study) -> None:
    """The study's table (analysis/study.py): CSV, Markdown, the report section and its figures."""
    try:
        from analysis import study as table
    except ImportError as exc:  # matplotlib missing: the cells are recorded; `report` writes the table later
        say(f"[study] no table written ({exc}); ./submit-job.sh report {study.folder} writes it where matplotlib is")
        return
    for path in table.write(study.folder):
        say(f"  wrote {path}")


# ---- what it prints ----------------------------------------------------------------------------------------------
def cell_text(cell: Cell) -> str:
    ref = " (reference)" if cell.reference else ""
    return f"{cell.model} {cell.gpus} GPUs {cell.layout.label} {cell.engine}{ref}"


def render_plan(study: Study) -> str:
    """What the study will do, cell by cell for its runs and by reason for the rest; the time and bytes expected."""
    request, sizing, cells = study.request, study.sizing, study.cells
    runs = [c for c in cells if c.option.mode != "predicted" and c.state in ("pending", "running")]
    kept = [c for c in cells if c.state in ("complete", "failed", "submitted")]
    expected = sum(c.option.seconds * sizing.factor for c in runs)
    models = len(request.models)
    ref = " and the reference layout" if request.options.reference else ""
    lines = [(f"[study] {len(cells)} cells ({models} model{'s' * (models > 1)}, GPU counts "
              f"{','.join(map(str, request.gpu_counts))}{ref},"
              f" engines {','.join(request.engines)}): every cell planned (exact files) and predicted (calibration "
              f"{cells[0].spec.calibration})"),
             f"[study] storage for the predictions: {sizing.store.get('label')} ({sizing.store.get('source')})",
             (f"[study] predicted for: {study.target['device']}, {study.target['gpus_per_node']} GPUs (ranks) per "
              f"node, {study.target['cpus_per_node']} CPUs per node ({study.target['cpus_source']})")]
    gap = next((c.prediction["phases"]["restart_launch_seconds"].get("why") for c in cells
                if c.prediction["phases"]["restart_launch_seconds"].get("seconds") is None), None)
    if gap:
        lines.append(f"[study] start-up not predicted: {gap}")
    lines += [f"[study] not placed: {n}" for n in study.notes]
    if kept:
        lines.append(f"[study] resumed: {len(kept)} cells kept from {study.folder}")
    lines.append(f"[study] {len(runs)} runs expected to take ~{sizes.clock(expected)} (the calibration's estimate x "
                 f"{sizing.factor:g}: this machine's {study.load.get('cpus')} CPUs at load "
                 f"{study.load.get('loadavg_1min')}; corrected after each run, each run sized again before it "
                 f"starts) of time_limit={request.options.time_limit:g} min; checkpoints up to "
                 f"{size_text(max((c.option.bytes for c in runs), default=0))} at once "
                 f"(disk={size_text(sizing.disk)}), {size_text(sum(c.option.bytes for c in runs))} written in all")
    for c in runs:
        last = sizes.shorten(c.option.reason.split(sizes.REASONS)[-1], 130)
        not_more = f"  (not more: {last})" if c.option.reason else ""
        lines.append(f"  {cell_text(c):<46} {c.option.text:<24} ~{sizes.clock(c.option.seconds * sizing.factor):>8} "
                     f"{size_text(c.option.bytes):>10}" + not_more)
    reasons = Counter(c.option.why or sizes.shorten(c.option.reason, 90) for c in cells
                      if c.option.mode == "predicted" and c.state == "planned")
    for why, n in reasons.items():
        lines.append(f"[study] planned and predicted only: {n} cells: {why}")
    return "\n".join(lines)
