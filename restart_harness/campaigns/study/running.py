"""The study's runs: each cell to run made one by one into the study's folder (study.json rewritten after each), sized
again with the time truly left, the time limit kept (SIGALRM), an interruption resumable; then the table."""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from restart_harness import resolve
from restart_harness.campaigns import outcome
from restart_harness.campaigns.study import campaign
from restart_harness.campaigns.study.campaign import Study
from restart_harness.campaigns.study.cells import Cell, Option
from restart_harness.campaigns.study.sizing import clock, predict_cells, priority, storage
from restart_harness.campaigns.sweep import made_run_dir, new_dir
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import read_json
from restart_harness.files.exclusive import hold
from restart_harness.phases import say
from restart_harness.phases.run import discard_checkpoint
from restart_harness.phases.run import run as run_one
from restart_harness.rundir.status import observed
from restart_harness.schema import STUDY


class TimeUp(KeyboardInterrupt):
    """The study's time limit: raised in the main thread like Ctrl-C, so a run in progress is stopped and recorded
    as one interrupted would be."""


def _alarm(signum, frame):
    raise TimeUp()


def run(study: Study) -> Path:
    """Run the study's cells into its folder (study.json rewritten after each), then write the table; returns the
    folder. Ctrl-C stops it (resume= continues); the time limit stops the run in progress and ends the study."""
    request = study.request
    if study.folder is None:
        results = next((t.split("=", 1)[1] for t in request.run_tokens if t.startswith("results_dir=")), "results")
        study.folder = new_dir(results, "study")
        hold(study.folder)  # a resume= of it while it runs is refused
    if study.sizing.store.get("assumed"):  # no baseline was cached: measured now, and the cells predicted with it
        study.sizing.store = storage(request, study.cells, measure=True)
        study.sizing.cache.clear()
        predict_cells(study.cells, study.sizing.store, study.target)
        campaign.project(study)
    say(campaign.render_plan(study))
    campaign.write(study)
    previous = signal.signal(signal.SIGALRM, _alarm)
    interrupted = None
    try:
        if request.options.fidelity != "predicted":
            left = study.deadline - time.time()
            if left <= 0:
                raise TimeUp()
            signal.setitimer(signal.ITIMER_REAL, left)
            _run_cells(study)
        study.state = "complete" if not any(c.state == "submitted" for c in study.cells) else "submitted"
    except TimeUp:
        study.state = "time_limit"
        _stop_remaining(study, f"the time limit (time_limit={request.options.time_limit:g} min) ended the study "
                               "before this cell's run")
    except KeyboardInterrupt as exc:
        study.state, interrupted = "interrupted", exc
        _stop_remaining(study, "the study was interrupted before this cell's run")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        campaign.write(study)
    campaign.table(study)
    if interrupted is not None:
        say(f"[study] interrupted; continue it with: ./submit-job.sh study resume={study.folder}")
        raise interrupted
    return study.folder


def _stop_remaining(study: Study, reason: str) -> None:
    for cell in study.cells:
        if cell.state == "running":  # stopped outside its run's own handling (between its launches and records)
            cell.state, cell.reason = "interrupted", cell.reason or reason
        elif cell.state == "pending":
            cell.state = "planned"
            cell.option = Option("predicted", reason=reason, why="no time left for a run", time_bound=True)


def _run_cells(study: Study) -> None:
    """Each cell to run in priority order, sized again with the time truly left and the machine factor so far."""
    for cell in study.cells:  # submitted earlier (resume=): what their jobs did
        if cell.state == "submitted" and cell.run_dir:
            cell.state = _observed(cell)
    coverage, rest = priority(study.to_run())
    order = [*coverage, *rest]
    total = sum(1 for c in order if c.state == "pending")
    done = 0
    for i, cell in enumerate(order):
        study.sizing.factor = campaign.factor_now(study)
        later = coverage[i + 1:] if i < len(coverage) else None
        option = campaign.next_for(cell, later, study.deadline - time.time(), study.sizing)
        if option.mode == "predicted":
            cell.state, cell.option = "planned", option
            campaign.write(study)
            continue
        done += 1
        say(f"[study {done}/{max(total, done)}] {campaign.cell_text(cell)}: {option.text}, "
            f"~{clock(option.seconds * study.sizing.factor)}; elapsed {clock(time.time() - study.started)}, "
            f"{clock(max(0.0, study.deadline - time.time()))} left")
        _run_cell(study, cell, option)
        say(f"[study {done}] {cell.state}" + (f": {cell.reason}" if cell.reason else "")
            + f" in {clock(cell.wall_seconds)}")
        campaign.write(study)


def _run_cell(study: Study, cell: Cell, option: Option) -> None:
    """The cell's run as `option` into the study's folder: its state, reason, wall seconds and attempts recorded."""
    cell.option, cell.state, cell.reason = option, "running", None
    campaign.write(study)
    spec = dataclasses.replace(option.plugins.spec, results_dir=str(study.folder))
    began = time.time()
    try:
        cell.run_dir = str(run_one(option.plugins.with_spec(spec), prefix=f"{cell.index:03d}-"))
        cell.state = _observed(cell)
    except RunFailed as exc:
        cell.state, cell.reason = "failed", str(exc)
    except KeyboardInterrupt:
        cell.state = "interrupted"
        cell.reason = "the study's time limit" if isinstance(sys.exc_info()[1], TimeUp) else "interrupted"
        _made_run_dir(study, cell)
        _discard(study, cell)
        campaign.write(study)
        raise
    except Exception as exc:  # noqa: BLE001 - one broken cell must not end the study
        cell.state, cell.reason = "failed", f"{type(exc).__name__}: {exc}"
    cell.wall_seconds = round(time.time() - began, 1)
    _made_run_dir(study, cell)
    if study.sizing.local and option.seconds and (cell.state == "complete" or cell.wall_seconds > option.seconds):
        # a run that failed after outlasting its estimate says the estimates are short here too
        study.ratios.append(round(cell.wall_seconds / option.seconds, 3))
    if cell.state == "failed":
        _discard(study, cell)


def _observed(cell: Cell) -> str:
    state = observed(Path(cell.run_dir))["state"]
    return {"dry_run": "complete"}.get(state, state)


def _made_run_dir(study: Study, cell: Cell) -> None:
    cell.run_dir = cell.run_dir or made_run_dir(study.folder, cell.index)
    if cell.run_dir and cell.run_dir not in cell.attempts:
        cell.attempts.append(cell.run_dir)


def _discard(study: Study, cell: Cell) -> None:
    """A failed or interrupted cell's checkpoint goes too (keep=false): its records say what it was."""
    if cell.run_dir is None or "keep=true" in study.request.run_tokens:
        return
    try:
        discard_checkpoint(resolve.read(Path(cell.run_dir)))
    except Exception as exc:  # noqa: BLE001 - a run that never wrote its spec has no checkpoint to delete
        say(f"  could not delete the checkpoint of {cell.run_dir}: {type(exc).__name__}: {exc}")


def main(study: Study) -> int:
    folder = run(study)
    recorded = read_json(folder / STUDY)
    counts = Counter(c["option"]["mode"] if c["state"] == "complete" else "predicted" if c["state"] == "planned"
                     else c["state"] for c in recorded["cells"])
    print(f"study {recorded['study_id']}: {recorded['state']}; {len(recorded['cells'])} cells: "
          + ", ".join(f"{n} {m}" for m, n in counts.items()))
    for c in recorded["cells"]:
        if ref := c.get("reference"):
            plan = c["plan"]
            same = sorted(f[0] for f in plan["files"]) == sorted(ref["files"])
            gb = plan["total_bytes"] / 1e9
            print(f"reference {c['id']}: planner {gb:.2f} GB in {plan['total_files']} files; the reference study's log "
                  f"{ref['checkpoint_gb']:.2f} GB in {len(ref['files'])} files"
                  f" ({'equal' if round(gb, 2) == ref['checkpoint_gb'] and same else 'DIFFERENT'})")
    print(folder)
    return outcome.exit_code(c["state"] for c in recorded["cells"])
