"""Reading status.json: `running` is only true while the harness process that wrote it is alive.

A harness killed outright (SIGKILL, a node lost) cannot write `failed`; its run directory keeps `running` with the
pid and host that wrote it, and everything learned so far. Readers (a later restart, the report) call observed(),
which reports such a run as `failed` with the reason "harness ended". Standard library only: analysis/ reads it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path


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
    if status["state"] == "running" and status.get("host") == socket.gethostname() and status.get("pid"):
        if not _alive(int(status["pid"])):
            return {**status, "state": "failed",
                    "reason": f"harness ended: its process (pid {status['pid']} on {status['host']}) is gone and the "
                              "run never finished"}
    return status


def find_run_dirs(root: Path) -> list[Path]:
    """Run directories (those holding spec.json) at or below root; a run's own subfolders are not searched."""
    root = Path(root)
    if (root / "spec.json").is_file():
        return [root]
    found = []
    for here, dirs, files in os.walk(root):
        if "spec.json" in files:
            found.append(Path(here))
            dirs.clear()  # a run directory holds checkpoints, not other runs
        else:
            dirs.sort()
    return sorted(found)
