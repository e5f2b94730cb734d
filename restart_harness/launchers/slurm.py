"""launcher=slurm: the run becomes an sbatch job (submitted from outside an allocation; inside one the ranks start
directly); each phase's ranks are one srun step over the job's nodes, MASTER_ADDR the allocation's first host.
Before submission sinfo says whether the partition has the nodes and sbatch --test-only whether it takes the job."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.launchers import _slurm
from restart_harness.launchers.base import WORKER_MODULE, Launcher, Scheduler, job_name, job_script, require


class SlurmScheduler(Scheduler):
    name = "Slurm"
    job_variable = _slurm.JOB_VARIABLE
    script_name = "job.sbatch"
    submit_argv = ("sbatch", "--parsable")
    ended_states = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                              "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"})

    def preflight(self) -> None:
        """The partition must have nodes= nodes that can run a job now (sinfo: not down, drained or unresponding),
        and sbatch --test-only must accept the job script (partition, account, time, nodes and tasks) before the
        run directory exists."""
        spec = self.spec
        if self.inside_job() or spec.dry_run or shutil.which("sbatch") is None:
            return
        usable, listed, down = _slurm.nodes(spec.queue)  # first: sbatch --test-only refuses these without naming them
        where = f"partition {spec.queue}" if spec.queue else "default partition"
        if listed and spec.nodes > listed:
            raise UsageError(f"launcher=slurm: nodes={spec.nodes}, but the {where} has {listed} nodes; accepted: "
                             f"nodes= up to {listed}, or queue= a larger partition")
        if listed and usable < spec.nodes:
            raise UsageError(f"launcher=slurm: nodes={spec.nodes}, but only {usable} of the {where}'s {listed} nodes "
                             f"can run a job now ({'; '.join(down)}); the job would wait until they return: check "
                             "`sinfo -R`, or ask for fewer nodes")
        if spec.device == "cuda":  # sbatch --test-only says only "Requested node configuration is not available"
            gpus = _slurm.gpus_per_node(spec.queue)
            most = max(gpus.values(), default=0)
            if gpus and most < spec.ranks_per_node:
                have = f"at most {most} GPUs a node" if most else "no GPUs (no gpu generic resource)"
                raise UsageError(f"launcher=slurm device=cuda: ranks_per_node={spec.ranks_per_node} asks for "
                                 f"{spec.ranks_per_node} GPUs on each node (--gpus-per-node, one a rank), but the "
                                 f"{where}'s nodes have {have}; accepted: "
                                 + (f"ranks_per_node= up to {most}, or queue= a partition with more GPUs a node"
                                    if most else "queue= a GPU partition, or device=cpu"))
        with tempfile.TemporaryDirectory(prefix="rh-test-only-") as scratch:
            script = Path(scratch) / self.script_name
            script.write_text(self.job_script(Path(scratch)))
            proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True,
                                  check=False, timeout=60, cwd=scratch)
        if proc.returncode != 0:
            said = " ".join((proc.stderr or proc.stdout).strip().split())
            raise UsageError(f"launcher=slurm: sbatch --test-only refuses the job ({said}); check queue=, account=, "
                             "walltime=, nodes= and ranks_per_node=")

    def job_script(self, run_dir: Path, job_args: list[str] | None = None) -> str:
        """#SBATCH header (nodes, tasks, time, partition, account, output) + the job body."""
        spec = self.spec
        return job_script(spec, run_dir, job_args, [
            ("#SBATCH --job-name=", job_name(run_dir, 64)), ("#SBATCH --nodes=", spec.nodes),
            ("#SBATCH --ntasks-per-node=", spec.ranks_per_node), ("#SBATCH --time=", spec.walltime),
            ("#SBATCH --output=", f"{run_dir}/logs/job-%j.log"),
            ("#SBATCH --gpus-per-node=", spec.ranks_per_node if spec.device == "cuda" else None),
            ("#SBATCH --partition=", spec.queue), ("#SBATCH --account=", spec.account)])

    def job_state(self, job_id: str) -> str | None:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False,
                              timeout=60)
        state = proc.stdout.strip().split()
        return state[0] if proc.returncode == 0 and state else None


class SlurmLauncher(Launcher):
    name = "slurm"
    description = "an sbatch job; srun starts each phase's ranks over the job's nodes"
    scheduler = SlurmScheduler
    rank_variables = _slurm.RANK_VARIABLES

    def preflight(self) -> None:
        require(self, list(_slurm.PROGRAMS) if SlurmScheduler.inside_job() else [] if self.spec.dry_run else ["sbatch"])

    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        """One srun step over the job's allocation; --kill-on-bad-exit ends every rank when one fails."""
        spec = self.spec
        return [*_slurm.RENDEZVOUS, f"export MASTER_ADDR MASTER_PORT={port}"], [
            "srun", f"--nodes={spec.nodes}", f"--ntasks={spec.world_size}", f"--ntasks-per-node={spec.ranks_per_node}",
            "--kill-on-bad-exit=1", sys.executable, "-m", WORKER_MODULE, *args]

    def per_node_command(self, argv: list[str]) -> list[str] | None:
        return _slurm.per_node(self.spec.nodes, argv)

    def task_verdicts(self, log: str) -> dict[int, str]:
        return _slurm.task_verdicts(log)
