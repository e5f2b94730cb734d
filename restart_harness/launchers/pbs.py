"""launcher=pbs: the run becomes a qsub job (PBS Pro, as on ALCF Polaris); each phase's ranks are one mpiexec over
$PBS_NODEFILE (Cray PALS / MPICH option names), MASTER_ADDR its first host. qsub has no test-only mode: the
scheduler's verdict comes at submission."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from restart_harness.launchers.base import WORKER_MODULE, Launcher, Raw, Scheduler, job_name, job_script, require
from restart_harness.launchers.mpiexec import RANK_VARIABLES


class PbsScheduler(Scheduler):
    name = "PBS"
    job_variable = "PBS_JOBID"
    script_name = "job.pbs"
    submit_argv = ("qsub",)
    ended_states = frozenset({"F"})  # PBS Pro's finished jobs (qstat -x)

    def job_script(self, run_dir: Path, job_args: list[str] | None = None) -> str:
        """#PBS header (select, place, walltime, filesystems, queue, account, output) + the job body."""
        spec = self.spec
        gpus = f":ngpus={spec.ranks_per_node}" if spec.device == "cuda" else ""
        return job_script(spec, run_dir, job_args, [
            ("#PBS -N ", job_name(run_dir, 15)),
            ("#PBS -l select=", f"{spec.nodes}:mpiprocs={spec.ranks_per_node}{gpus}"),
            ("#PBS -l place=", "scatter"), ("#PBS -l walltime=", spec.walltime), ("#PBS -j ", "oe"),
            ("#PBS -o ", f"{run_dir}/logs/job.log"), ("#PBS -l filesystems=", spec.filesystems),
            ("#PBS -q ", spec.queue), ("#PBS -A ", spec.account)])

    def job_state(self, job_id: str) -> str | None:
        proc = subprocess.run(["qstat", "-x", "-f", job_id], capture_output=True, text=True, check=False, timeout=60)
        fields = (line.strip().partition(" = ") for line in proc.stdout.splitlines())
        return next((value.strip() for key, _, value in fields if key == "job_state"), None)


class PbsLauncher(Launcher):
    name = "pbs"
    description = "a qsub job (PBS Pro); mpiexec over $PBS_NODEFILE starts each phase's ranks"
    scheduler = PbsScheduler
    rank_variables = RANK_VARIABLES

    def preflight(self) -> None:
        require(self, ["mpiexec"] if PbsScheduler.inside_job() else [] if self.spec.dry_run else ["qsub"])

    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        spec = self.spec
        return ['MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"', f"export MASTER_ADDR MASTER_PORT={port}"], [
            "mpiexec", "-n", str(spec.world_size), "--ppn", str(spec.ranks_per_node),
            "--hostfile", Raw('"$PBS_NODEFILE"'), sys.executable, "-m", WORKER_MODULE, *args]

    def per_node_command(self, argv: list[str]) -> list[str] | None:
        return ["mpiexec", "-n", str(self.spec.nodes), "--ppn", "1", "--hostfile",
                os.environ.get("PBS_NODEFILE", ""), *argv]
