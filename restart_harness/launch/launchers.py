"""Submitting batch jobs (sbatch / qsub); whether a run is submitted at all is machine.submits()."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from restart_harness.errors import RunFailed


def submit(launcher: str, script: Path) -> str:
    """Submit script with sbatch / qsub; returns the job id."""
    cmd = ["sbatch", "--parsable", str(script)] if launcher == "slurm" else ["qsub", str(script)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=script.parent)
    if proc.returncode != 0:
        raise RunFailed(f"{cmd[0]} refused {script}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.strip().split(";")[0]  # sbatch --parsable: "jobid[;cluster]"


_SRUN_TASKS = re.compile(r"^srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<how>.+?)\s*$", re.MULTILINE)


def task_verdicts(log: str) -> dict[int, str]:
    """rank -> how srun says its task ended ("Killed", "Terminated", "Exited with exit code 1"), from a launch's
    log ("srun: error: node2: tasks 2-3: Killed"); empty for other launchers."""
    out = {}
    for m in _SRUN_TASKS.finditer(log):
        for part in m["tasks"].split(","):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                out[rank] = m["how"]
    return out
