"""status.json, written and read: `running` is only true while the harness process that wrote it is alive (a harness
killed outright leaves it: readers call observed(), docs/results.md). The records a run's phases claim: each restart's
event folder, each launch's records/<record>.json (its wall time, exit code, page-cache state and what it was started
with). find_run_dirs is the one finder of run directories. analysis/ reads it (no torch, no plug-ins)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic
from restart_harness.schema import SPEC as SPEC_FILE


def set_status(run_dir: Path, state: str, reason: str | None = None, **extra) -> None:
    """status.json; `running` carries this process's pid and host so a reader can tell a crashed run."""
    status = {"state": state, "reason": reason, "time": time.time(), **extra}
    if state == "running":
        status.update(pid=os.getpid(), host=socket.gethostname())
    write_json_atomic(run_dir / "status.json", status)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def observed(run_dir: Path) -> dict:
    """status.json as written; `failed` ("harness ended") when it says running but its process on this host is gone;
    state `missing` or `unreadable` when there is no status.json, or it is not a status."""
    path = Path(run_dir) / "status.json"
    if not path.is_file():
        return {"state": "missing", "reason": f"no status.json in {run_dir}"}
    try:
        status = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {"state": "unreadable", "reason": f"status.json is not readable JSON ({exc})"}
    if not isinstance(status, dict) or not isinstance(status.get("state"), str):
        return {"state": "unreadable", "reason": "status.json holds no state"}
    if (status["state"] == "running" and status.get("host") == socket.gethostname() and status.get("pid")
            and not _alive(int(status["pid"]))):
        return {**status, "state": "failed",
                "reason": f"harness ended: its process (pid {status['pid']} on {status['host']}) is gone and the "
                          "run never finished"}
    return status


def allocate_record(run_dir: Path) -> str:
    """The next free restart record name (restart-01, restart-02, ...), claimed by creating its event folder:
    mkdir is atomic, so two concurrent restart-only re-runs never get the same record."""
    events = run_dir / "events"
    events.mkdir(exist_ok=True)
    for n in range(1, 10000):
        record = f"restart-{n:02d}"
        with contextlib.suppress(FileExistsError):
            (events / record).mkdir()
            return record
    raise RunFailed(f"no free restart record name under {events}")


def save_record(run_dir: Path, info: dict) -> None:
    """records/<record>.json: one launch as it went."""
    (run_dir / "records").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "records" / f"{info['record']}.json", info)


def find_run_dirs(root: Path) -> list[Path]:
    """Run directories (those holding spec.json) at or below root; a run's own subfolders are not searched."""
    found = []
    for here, dirs, files in os.walk(root):
        if SPEC_FILE in files:
            found.append(Path(here))
            dirs.clear()  # a run directory holds checkpoints, not other runs
        else:
            dirs.sort()
    return sorted(found)
