"""Which launchers can run here, and submitting batch jobs (sbatch / qsub). Checked before anything is written."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from restart_harness.errors import RunFailed, UsageError
from restart_harness.spec.runspec import RunSpec

SUBMIT = {"slurm": "sbatch", "pbs": "qsub"}
_JOB_ENV = {"slurm": "SLURM_JOB_ID", "pbs": "PBS_JOBID"}


def inside_job(launcher: str) -> bool:
    """True when this process already runs inside an allocation of launcher's scheduler."""
    return bool(os.environ.get(_JOB_ENV.get(launcher, ""), ""))


def submits(spec: RunSpec) -> bool:
    """slurm/pbs from outside an allocation: the run becomes a batch job. Inside one, ranks start directly."""
    return spec.launcher in SUBMIT and not inside_job(spec.launcher)


def check(spec: RunSpec) -> None:
    """Raise UsageError (one line) when spec's launcher cannot run here; nothing has been written yet."""
    if spec.launcher in ("local", "torchrun") and spec.nodes > 1:
        raise UsageError(f"nodes={spec.nodes} with launcher={spec.launcher}: it starts ranks on this node only; "
                         "accepted: nodes=1, or launcher=slurm|pbs for several nodes")
    if spec.env_hook:
        hook = Path(spec.env_hook).expanduser()
        if not hook.is_file():
            raise UsageError(f"env_hook={spec.env_hook}: no such file (a bash file sourced before the ranks start)")
        spec.env_hook = str(hook.resolve())
    needs = []
    if spec.launcher == "slurm":
        needs = ["srun", "scontrol"] if inside_job("slurm") else ([] if spec.dry_run else ["sbatch"])
    elif spec.launcher == "pbs":
        needs = ["mpiexec"] if inside_job("pbs") else ([] if spec.dry_run else ["qsub"])
    for program in needs:
        if shutil.which(program) is None:
            raise UsageError(f"launcher={spec.launcher} needs {program}, which is not installed here (not on PATH); "
                             "accepted here: launcher=local, launcher=torchrun, or dry_run=true to only write "
                             "the job script")


def submit(launcher: str, script: Path) -> str:
    """Submit script with sbatch / qsub; returns the job id."""
    cmd = ["sbatch", "--parsable", str(script)] if launcher == "slurm" else ["qsub", str(script)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=script.parent)
    if proc.returncode != 0:
        raise RunFailed(f"{cmd[0]} refused {script}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.strip().split(";")[0]  # sbatch --parsable: "jobid[;cluster]"
