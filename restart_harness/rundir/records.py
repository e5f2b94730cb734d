"""The records a run's phases claim: the name of each restart's event folder, and each launch's record
(records/<record>.json: its wall time, exit code, page-cache state and what it was started with)."""

from __future__ import annotations

from pathlib import Path

from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic


def allocate_record(run_dir: Path) -> str:
    """The next free restart record name (restart-01, restart-02, ...), claimed by creating its event folder:
    mkdir is atomic, so two concurrent restart-only re-runs never get the same record."""
    events = run_dir / "events"
    events.mkdir(exist_ok=True)
    for n in range(1, 10000):
        record = f"restart-{n:02d}"
        try:
            (events / record).mkdir()
            return record
        except FileExistsError:
            continue
    raise RunFailed(f"no free restart record name under {events}")


def save_record(run_dir: Path, info: dict) -> None:
    """records/<record>.json: one launch as it went."""
    (run_dir / "records").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "records" / f"{info['record']}.json", info)
