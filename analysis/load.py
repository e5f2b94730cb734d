"""Find run directories under the paths given and read their result files (summary.json, inventory.json,
status.json, sweep.json). Reads only files, with the harness's schema module (standard library only): never the
runner, torch or DeepSpeed, so it works wherever matplotlib does."""

from __future__ import annotations

import fnmatch
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from restart_harness import schema
from restart_harness.results.views import SummaryView
from restart_harness.rundir.status import find_run_dirs, observed

# spec fields that must be present for a run to be placed on any table or plot.
REQUIRED_SPEC = ("model", "tp", "pp", "dp", "engine")


@dataclass
class Run:
    """One readable run: its directory, its summary, and what the analysis noticed while reading it."""

    dir: Path
    summary: dict
    inventory: dict | None = None
    sweep: str | None = None
    notes: list[str] = field(default_factory=list)

    @cached_property
    def view(self) -> SummaryView:
        """The summary as typed records (results/views.py), as the terminal reads it."""
        return SummaryView.of(self.summary)

    @property
    def run_id(self) -> str:
        return str(self.view.run_id or self.dir.name)

    @property
    def spec(self) -> dict:
        return self.summary["spec"]

    @property
    def state(self) -> str:
        status = self.view.status
        return str((status.get("state") if isinstance(status, dict) else None) or "unknown")


@dataclass
class Skipped:
    """A path that could not be used, and why (one line for stderr and the report)."""

    path: Path
    reason: str

    def line(self) -> str:
        return f"skipped {self.path}: {self.reason}"


@dataclass
class SweepFailure:
    """A sweep combination that left no readable run (from sweep.json)."""

    sweep: str
    combination: str
    state: str
    reason: str


def _read_json(path: Path) -> tuple[object | None, str | None]:
    """(data, None) or (None, what is wrong with the file)."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, f"no {path.name}"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {path.name} ({exc.__class__.__name__}: {exc})"
    except json.JSONDecodeError as exc:
        return None, f"corrupt {path.name} (not JSON: {exc.msg} at line {exc.lineno} column {exc.colno})"


def _sweep_of(run_dir: Path, root: Path) -> str | None:
    """Name of the nearest folder between run_dir and root holding a sweep.json, if any."""
    for parent in [run_dir.parent, *run_dir.parent.parents]:
        if (parent / "sweep.json").is_file():
            return parent.name
        if parent == root or parent == parent.parent:
            break
    return None


def _check_summary(summary: object) -> tuple[str | None, list[str]]:
    """(reason it cannot be read, or None; notes about what it lacks)."""
    if not isinstance(summary, dict):
        return f"corrupt summary.json (top level is {type(summary).__name__}, expected an object)", []
    version = summary.get("schema_version")
    notes = []
    if not isinstance(version, int) or isinstance(version, bool):
        return ("summary.json has no integer schema_version, so it is not a restart-harness summary this analysis "
                f"can read (it reads schema_version {', '.join(map(str, schema.READABLE_VERSIONS))})"), []
    if version < min(schema.READABLE_VERSIONS):
        return f"summary.json schema_version {version} is older than any this analysis reads", []
    if version > max(schema.READABLE_VERSIONS):
        notes.append(f"schema_version {version} is newer than this analysis knows "
                     f"({max(schema.READABLE_VERSIONS)}); only the fields it knows are used")
    if not isinstance(spec := summary.get("spec"), dict):
        return "summary.json has no spec object", notes
    if missing := [k for k in REQUIRED_SPEC if k not in spec]:
        return f"summary.json spec lacks {', '.join(missing)}", notes
    for key, kind in (("checkpoint", dict), ("restart", dict), ("restarts", list), ("training", dict)):
        value = summary.get(key)
        if value is not None and not isinstance(value, kind):
            return f"summary.json field {key} is {type(value).__name__}, expected {kind.__name__} or null", notes
    return None, notes


def read_run(run_dir: Path, root: Path | None = None) -> Run | Skipped:
    """A Run, or Skipped naming why not (still running, no or corrupt summary.json, unknown schema)."""
    status = observed(run_dir)
    if status["state"] in ("running", "submitted"):
        return Skipped(run_dir, f"run still in progress (status.json state is {status['state']})")
    summary, problem = _read_json(run_dir / "summary.json")
    if problem:
        if problem == "no summary.json":
            problem = "no summary.json (the run never finished writing its results)"
            if status["state"] == "failed":
                problem = f"failed: {status.get('reason')}; no results were written"
        return Skipped(run_dir, problem)
    reason, notes = _check_summary(summary)
    if reason:
        return Skipped(run_dir, reason)
    if status["state"] == "failed" and (summary.get("status") or {}).get("state") != "failed":
        # the harness died during a later restart-only re-run: its summary predates that
        summary = {**summary, "status": {"state": "failed", "reason": status.get("reason")}}
    if status["state"] == "unreadable":
        notes.append(status["reason"])
    inventory, inv_problem = _read_json(run_dir / "inventory.json")
    if inv_problem and inv_problem != "no inventory.json":
        notes.append(f"{inv_problem}; no file-size distribution for this run")
    if inventory is not None and not (isinstance(inventory, dict) and isinstance(inventory.get("files"), list)):
        notes.append("inventory.json has no files list; no file-size distribution for this run")
        inventory = None
    return Run(dir=run_dir, summary=summary, inventory=inventory, sweep=_sweep_of(run_dir, root or run_dir),
               notes=notes)


def sweep_failures(roots: list[Path], runs: list[Run]) -> list[SweepFailure]:
    """Combinations a sweep.json records as not complete whose run is not among the runs read."""
    read = {r.dir.resolve() for r in runs}
    out = []
    for root in roots:
        for path in sorted(root.rglob("sweep.json")) if root.is_dir() else []:
            data = _read_json(path)[0]
            entries = data.get("runs") if isinstance(data, dict) else None  # campaigns/sweep.py writes them
            if not isinstance(entries, list):
                continue
            for entry in entries:
                if not isinstance(entry, dict) or entry.get("state") == "complete":
                    continue
                run_dir = entry.get("run_dir")
                if run_dir and (path.parent / run_dir).resolve() in read:
                    continue
                combo = entry.get("combination") or entry.get("index")
                out.append(SweepFailure(path.parent.name, json.dumps(combo) if not isinstance(combo, str) else combo,
                                        str(entry.get("state")), str(entry.get("reason") or "")))
    return out


INCLUDE = ("failed", "dry")  # what a report leaves out unless asked: runs that did not finish, dry runs


@dataclass
class Loaded:
    """What load() found: the runs to report, what could not be read, and how many runs were left out by choice."""

    runs: list[Run]
    skipped: list[Skipped]
    left_out: dict[str, int] = field(default_factory=dict)  # "failed" / "dry" / "not matching" -> runs

    def __iter__(self):  # runs, skipped = load(...)
        return iter((self.runs, self.skipped))

    def __getitem__(self, i: int):  # load(...)[0]: the runs
        return (self.runs, self.skipped)[i]


def _left_out_as(result: Run | Skipped, run_dir: Path) -> str | None:
    """Which of INCLUDE a run belongs to when a report leaves it out by default, or None (always reported)."""
    if isinstance(result, Run):
        return None if result.state == "complete" else "failed"
    state = observed(run_dir)["state"]
    return "dry" if state == "dry_run" else "failed" if state in ("failed", "unreadable") else None


def load(paths: list[str | Path], include: tuple[str, ...] = INCLUDE, match: str | None = None) -> Loaded:
    """Every run found under the paths (each read once), every path or run skipped, and how many runs `include` (of
    failed and dry runs) and `match` (a glob on the folder name or path below the folder given) left out."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    left_out: Counter = Counter()
    seen: set[Path] = set()
    for given in paths:
        root = Path(given)
        dirs = find_run_dirs(root) if root.is_dir() else []
        if not dirs:
            why = ("no run directories found (none holds a spec.json)" if root.is_dir() else
                   "not a directory (give run directories or folders containing runs)" if root.exists() else
                   "no such file or directory")
            skipped.append(Skipped(root, why))
            continue
        for run_dir in dirs:
            if (key := run_dir.resolve()) in seen:
                continue
            seen.add(key)
            rel = run_dir.relative_to(root).as_posix() if run_dir != root else run_dir.name
            if match and not (fnmatch.fnmatch(run_dir.name, match) or fnmatch.fnmatch(rel, match)):
                left_out["not matching"] += 1
                continue
            result = read_run(run_dir, root)
            if (kind := _left_out_as(result, run_dir)) is not None and kind not in include:
                left_out[kind] += 1
                continue
            (skipped if isinstance(result, Skipped) else runs).append(result)
    return Loaded(runs, skipped, dict(left_out))
