"""Reading status.json: `running` is only true while the harness process that wrote it is alive.

A harness killed outright (SIGKILL, a node lost) cannot write `failed`; its run directory keeps `running` with
the pid and host that wrote it, and everything learned so far. Readers call observed() to tell the two apart."""

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
    """status.json as written, with `state` `crashed` when it says running but its process on this host is gone."""
    path = Path(run_dir) / "status.json"
    if not path.is_file():
        return {"state": "missing", "reason": f"no status.json in {run_dir}"}
    status = json.loads(path.read_text())
    if status.get("state") == "running" and status.get("host") == socket.gethostname() and status.get("pid"):
        if not _alive(int(status["pid"])):
            return {**status, "state": "crashed",
                    "reason": f"the harness (pid {status['pid']} on {status['host']}) ended without finishing"}
    return status
