"""Submitting batch jobs (sbatch / qsub); whether a run is submitted at all is machine.submits()."""

from __future__ import annotations

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
