"""RunRecord: one run as it was made: its RunSpec, run directory, where its checkpoints are (the storage target's
record), and host and software facts. Written once as spec.json; read() is its one reader (a restart at another
layout has its own: records/spec-<record>.json)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.files.atomic import write_json_atomic
from restart_harness.schema import SPEC as SPEC_FILE
from restart_harness.spec.runspec import RunSpec

# Fields spec.json holds beside the RunSpec's own: host and software facts, and the target's record.
FACT_FIELDS = ("versions", "host", "checkpoint_filesystem", "io_sources")


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    spec: RunSpec
    target_record: dict  # the storage target's record (targets/): its name, where the checkpoints are, its settings
    # versions, host, checkpoint_filesystem (machine.py); io_sources (rundir/observe.py)
    facts: dict = field(default_factory=dict)
    record: str | None = None  # the restart record whose own spec this is (a restart at another layout), or None

    @property
    def checkpoint_root(self) -> Path:
        """The local folder DeepSpeed and DCP are handed: the checkpoints themselves, or (object storage) the index
        of their names. Inside the run directory it is found relative to it, so a moved or copied run folder uses
        its own checkpoint, never the original's."""
        if inside := self.target_record.get("checkpoint_root_in_run"):
            return self.run_dir / inside
        root = Path(self.target_record["checkpoint_root"])
        if root.name == "checkpoint" and root.parent.name == self.run_dir.name:  # runs of harness 0.2.0
            return self.run_dir / "checkpoint"
        return root

    def checkpoint_elsewhere(self) -> str | None:
        """Why the checkpoint this run directory names is another run's (a run folder copied or moved under another
        name, whose checkpoints are outside it), or None. A checkpoint inside the run directory is always its own."""
        placed_for = self.target_record.get("checkpoint_run")
        if self.target_record.get("checkpoint_data_in_run") or placed_for in (None, self.run_dir.name):
            return None
        where = self.target_record.get("checkpoint_url") or self.target_record["checkpoint_root"]
        return (f"its checkpoints were placed for run {placed_for} (at {where}), not for this folder "
                f"({self.run_dir.name}): a copy or a move of that run; restart the run itself, or give the copy its "
                "own checkpoint")

    def to_json(self) -> dict:
        return {**self.spec.to_json(), **self.facts, **self.target_record}

    def write(self) -> None:
        write_json_atomic(self.run_dir / SPEC_FILE, self.to_json())

    def write_record_spec(self, record: str, spec: RunSpec) -> Path:
        """records/spec-<record>.json: this run at another layout, for one restart record."""
        path = record_spec_path(self.run_dir, record)
        path.parent.mkdir(exist_ok=True)
        write_json_atomic(path, dataclasses.replace(self, spec=spec).to_json())
        return path


def record_spec_path(run_dir: Path, record: str) -> Path:
    return Path(run_dir) / "records" / f"spec-{record}.json"


def read(run_dir: Path, record: str | None = None) -> RunRecord:
    """The run in run_dir (with the spec of `record` where that restart has its own); UsageError naming the problem
    when the folder is not a readable run directory."""
    run_dir = Path(run_dir)
    own = record_spec_path(run_dir, record) if record else None
    path = own if own is not None and own.is_file() else run_dir / SPEC_FILE
    if not path.is_file():
        raise UsageError(f"run={run_dir}: not a run directory (no {SPEC_FILE})")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"run={run_dir}: {path.name} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"run={run_dir}: {path.name} holds no run (expected a JSON object)")
    try:
        spec = RunSpec.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"run={run_dir}: {path.name} is not a run's spec ({type(exc).__name__}: {exc})") from None
    if "checkpoint_root" not in data:
        raise UsageError(f"run={run_dir}: {path.name} does not say where the checkpoints are (no checkpoint_root)")
    known = {f.name for f in dataclasses.fields(RunSpec)} | {"derived", *FACT_FIELDS}
    target = {k: v for k, v in data.items() if k not in known}
    facts = {k: data[k] for k in FACT_FIELDS if k in data}
    return RunRecord(run_dir.resolve(), spec, target, facts, record if own is not None and own.is_file() else None)
