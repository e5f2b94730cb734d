"""status.json, written and read: `running` is only true while the harness process that wrote it is alive (a harness
killed outright leaves it: readers call observed(), docs/results.md). find_run_dirs is the one finder of run
directories. analysis/ reads it (no torch, no plug-ins)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

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


def find_run_dirs(root: Path) -> list[Path]:
    """Run directories (those holding spec.json) at or below root; a run's own subfolders are not searched."""
    root = Path(root)
    if (root / SPEC_FILE).is_file():
        return [root]
    found = []
    for here, dirs, files in os.walk(root):
        if SPEC_FILE in files:
            found.append(Path(here))
            dirs.clear()  # a run directory holds checkpoints, not other runs
        else:
            dirs.sort()
    return sorted(found)
