"""`./submit-job.sh clean`: delete the checkpoints of finished runs, keep their results (docs/keys.md, clean). A dry run
unless apply=true; runs in progress are never touched; a run whose checkpoint is deleted says so in status.json
(checkpoint_deleted), as keep=false does, so a restart-only re-run of it is refused in one line."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from restart_harness import resolve
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.rundir.status import find_run_dirs, observed

FINISHED = ("complete", "failed")


@dataclass
class Candidate:
    run_dir: Path
    state: str
    age_hours: float | None
    where: str  # the checkpoint, as its target names it
    files: int
    bytes: int


def candidates(folder: Path, older_than_hours: float | None, larger_than: int | None,
               prefix: str | None) -> tuple[list[Candidate], list[str], dict[str, int]]:
    """The finished runs below folder whose checkpoint is still there and passes the filters; one line for each run
    that could not be checked; and how many runs were left alone, by why."""
    out, problems, left = [], [], Counter()
    for run_dir in find_run_dirs(folder):
        if prefix and not run_dir.name.startswith(prefix):
            left[f"not starting with {prefix}"] += 1
            continue
        status = observed(run_dir)
        if status["state"] not in FINISHED or status.get("checkpoint_deleted"):
            left["already cleaned" if status.get("checkpoint_deleted") else
                  "dry runs" if status["state"] == "dry_run" else f"{status['state']}"] += 1
            continue
        when = status.get("time")
        age = (time.time() - when) / 3600 if isinstance(when, (int, float)) else None
        if older_than_hours is not None and (age is None or age < older_than_hours):
            left[f"finished less than {older_than_hours:g} h ago"] += 1
            continue
        try:
            run = resolve.read(run_dir)
            if run.stored.missing():
                left["checkpoint already gone"] += 1
                continue
            listing = [f for files in run.stored.listing().values() for f in files]
        except Exception as exc:  # noqa: BLE001 - a run folder from elsewhere, an object store that does not answer: said, skipped
            problems.append(f"{run_dir}: not checked ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})")
            continue
        nbytes = sum(n for _, n in listing)
        if larger_than is not None and nbytes <= larger_than:
            left[f"checkpoint not larger than {larger_than:,} bytes"] += 1
            continue
        out.append(Candidate(run_dir, status["state"], age, run.target.describe(), len(listing), nbytes))
    return out, problems, left


def delete(candidate: Candidate) -> str:
    """Delete one run's checkpoint through its target; mark its status.json; returns what was deleted."""
    deleted = resolve.read(candidate.run_dir).stored.delete()
    status_path = candidate.run_dir / "status.json"
    write_json_atomic(status_path, {**read_json(status_path), "checkpoint_deleted": True})
    return deleted


def line(c: Candidate) -> str:
    age = f", finished {c.age_hours:,.1f} h ago" if c.age_hours is not None else ""
    return f"{c.where}: {c.files} files, {c.bytes / 2**20:,.1f} MiB (run {c.run_dir.name}, {c.state}{age})"
