"""Batch job scripts for clusters: an sbatch script (Slurm) or a qsub script (PBS Pro, as on ALCF Polaris).

The job runs `python -m restart_harness.launch.job RUN_DIR`, which does inside the allocation what a local run
does: the checkpoint launch, the page-cache step, the restart as a second, separate launch (a real restart in
fresh processes), and finalize, all into the same run directory. The Python that submitted the job runs it
(clusters share the file system); env_hook= is sourced by the job script and by every launch script.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from restart_harness import SOURCE_ROOT
from restart_harness.spec.runspec import RunSpec

SCRIPT_NAMES = {"slurm": "job.sbatch", "pbs": "job.pbs"}
JOB_MODULE = "restart_harness.launch.job"


def _job_name(run_dir: Path, limit: int) -> str:
    # PBS job names: at most 15 characters, starting with a letter
    name = "rh-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.name)
    return name[:limit]


def _body(spec: RunSpec, run_dir: Path, job_args: list[str]) -> list[str]:
    lines = ["set -euo pipefail", f"cd {shlex.quote(str(SOURCE_ROOT))}"]
    if spec.env_hook:  # the harness's own Python may need the modules too (shared libraries); ranks source it again
        lines.append(f"source {shlex.quote(spec.env_hook)}  # env_hook: modules, conda, ...")
    return lines + [
        "exec " + " ".join(shlex.quote(p) for p in [sys.executable, "-m", JOB_MODULE, str(run_dir), *job_args]),
    ]


def sbatch_script(spec: RunSpec, run_dir: Path, job_args: list[str] | None = None) -> str:
    """#SBATCH header (nodes, tasks, time, partition, account, output) + the job body."""
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={_job_name(run_dir, 64)}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={spec.ranks_per_node}",
        f"#SBATCH --time={spec.walltime}",
        f"#SBATCH --output={run_dir}/logs/job-%j.log",
    ]
    if spec.device == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={spec.ranks_per_node}")
    if spec.queue:
        lines.append(f"#SBATCH --partition={spec.queue}")
    if spec.account:
        lines.append(f"#SBATCH --account={spec.account}")
    lines.append("# restart-harness job, generated: checkpoint launch, page cache, restart launch, finalize")
    return "\n".join(lines + _body(spec, run_dir, job_args or [])) + "\n"


def qsub_script(spec: RunSpec, run_dir: Path, job_args: list[str] | None = None) -> str:
    """#PBS header (select, place, walltime, filesystems, queue, account, output) + the job body."""
    select = f"{spec.nodes}:mpiprocs={spec.ranks_per_node}"
    if spec.device == "cuda":
        select += f":ngpus={spec.ranks_per_node}"
    lines = [
        "#!/usr/bin/env bash",
        f"#PBS -N {_job_name(run_dir, 15)}",
        f"#PBS -l select={select}",
        "#PBS -l place=scatter",
        f"#PBS -l walltime={spec.walltime}",
        "#PBS -j oe",
        f"#PBS -o {run_dir}/logs/job.log",
    ]
    if spec.filesystems:
        lines.append(f"#PBS -l filesystems={spec.filesystems}")
    if spec.queue:
        lines.append(f"#PBS -q {spec.queue}")
    if spec.account:
        lines.append(f"#PBS -A {spec.account}")
    lines.append("# restart-harness job, generated: checkpoint launch, page cache, restart launch, finalize")
    return "\n".join(lines + _body(spec, run_dir, job_args or [])) + "\n"


def job_script(spec: RunSpec, run_dir: Path, job_args: list[str] | None = None) -> tuple[str, str]:
    """(file name, text) of the batch script for spec.launcher (slurm or pbs)."""
    build = sbatch_script if spec.launcher == "slurm" else qsub_script
    return SCRIPT_NAMES[spec.launcher], build(spec, run_dir, job_args)
