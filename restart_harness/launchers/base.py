"""The interface between the harness and a launcher: what starts the ranks of a phase. One module in
restart_harness/launchers/ per launcher, holding one subclass of Launcher; the launcher is chosen once by
`launcher=` (restart_harness/resolve.py) and everything that depends on it is asked of it, never tested elsewhere.

Two sides of a launcher, as submitit pairs an executor with a job environment:
  where the command is typed   check (pure), preflight (its tools here), submits (a batch job, or ranks started here),
                               job_script and submit for a batch scheduler, the launch script's command and lines
  inside the launch            rank_variables: how a rank finds its rank, local rank, world size and node from the
                               environment the launcher set (its launch script exports them: rank_env.py fills
                               DeepSpeed's names from them);
                               per_node_command: work once per node (the page-cache step); task_verdicts: how it says
                               a rank's task ended (a lost node)
The predictor fits the launch phase per calibration_key.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from restart_harness import SOURCE_ROOT, rank_env
from restart_harness.errors import UsageError

WORKER_MODULE = "restart_harness.worker"
JOB_MODULE = "restart_harness.phases.job"
class Raw(str):
    """A command part written into the script unquoted (a shell variable such as "$PBS_NODEFILE")."""


def shell_line(command: list[str]) -> str:
    return " ".join(p if isinstance(p, Raw) else shlex.quote(p) for p in command)


class Launcher(ABC):
    """What starts one run's ranks (`spec`: the RunSpec; read, never changed)."""

    name: ClassVar[str]  # the launcher= value, recorded in spec.json
    aliases: ClassVar[tuple[str, ...]] = ()  # other launcher= values meaning this one
    description: ClassVar[str]  # one line for --help and the docs
    scheduler: ClassVar[str | None] = None  # a batch scheduler's name when runs become its jobs (Slurm, PBS)
    job_variable: ClassVar[str | None] = None  # set inside one of its jobs (SLURM_JOB_ID): the ranks start directly
    # RANK, WORLD_SIZE, LOCAL_RANK, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE -> the launcher's own variables, in order of
    # preference; a name absent here is one the launcher sets itself (or rank_env.py derives)
    rank_variables: ClassVar[dict[str, tuple[str, ...]]] = {}
    subset: ClassVar[bool] = False  # can start only the first node's ranks here (subset=true)
    port_here: ClassVar[bool] = False  # the rendezvous port (master_port=) is bound on this node
    # forks the ranks from one process that imported for them: a node imports once (worker/io_marks.py)
    forks_ranks: ClassVar[bool] = False

    def __init__(self, spec):
        self.spec = spec
        # a refusal may suggest dry_run=true: not to a command that takes none (restart, study: they set it False)
        self.offers_dry_run = spec.phase != "restart"

    # ---- before anything is created --------------------------------------------------------------------------
    @classmethod
    def check(cls, spec) -> None:
        """Pure checks of the keys against this launcher (no machine): UsageError naming the value."""
        if spec.subset and not cls.subset:
            from restart_harness.launchers import all_launchers

            takers = "|".join(n for n, c in all_launchers().items() if c.subset)
            raise UsageError(f"subset=true with launcher={spec.launcher}: a subset runs on the node it is started on; "
                             f"accepted: launcher={takers}")
        if spec.wait and cls.scheduler is None:
            from restart_harness.launchers import all_launchers

            takers = "|".join(n for n, c in all_launchers().items() if c.scheduler)
            raise UsageError(f"wait=true with launcher={spec.launcher}: a run started here returns when it ends; "
                             f"accepted: wait=true with launcher={takers}")

    def preflight(self) -> None:
        """The launcher can run from here: the programs it needs are on PATH (UsageError otherwise)."""
        for program in self.needs():
            if shutil.which(program) is None:
                raise UsageError(f"launcher={self.spec.launcher} needs {program}, which is not installed here (not on "
                                 f"PATH); accepted here: {self.accepted_here()}")

    def needs(self) -> list[str]:
        """Programs this launch runs on this machine."""
        return []

    def accepted_here(self) -> str:
        return "launcher=local, launcher=torchrun" + self.dry_run_hint("the job script")

    def dry_run_hint(self, what: str) -> str:
        """The dry run a refusal may suggest, where the command takes one (offers_dry_run)."""
        return f", or dry_run=true to only write {what}" if self.offers_dry_run else ""

    def scheduler_preflight(self) -> None:
        """What the scheduler says of the job before it is submitted (Slurm: sinfo and sbatch --test-only)."""

    @classmethod
    def inside_job(cls) -> bool:
        """This process already runs inside one of this scheduler's jobs."""
        return bool(cls.job_variable and os.environ.get(cls.job_variable))

    @classmethod
    def submits(cls) -> bool:
        """The run becomes a batch job (a scheduler's launcher, from outside one of its jobs)."""
        return cls.scheduler is not None and not cls.inside_job()

    # ---- the launch script ------------------------------------------------------------------------------------
    @abstractmethod
    def rank_command(self, port: int, args: list[str]) -> list[str]:
        """The command that starts every rank of one phase (`args`: the worker's)."""

    def environment(self) -> dict[str, str]:
        """Variables the launch script exports for the ranks (beyond the harness's own): where a rank finds its rank
        variables (rank_env.py reads them before anything is imported)."""
        return {rank_env.VARIABLE: rank_env.encode(self.rank_variables)} if self.rank_variables else {}

    def script_lines(self, port: int) -> list[str]:
        """Shell lines run before the command (where the rendezvous is, a host file)."""
        return []

    def execs(self) -> bool:
        """The script execs the command (False where a trap must run when it ends)."""
        return True

    def unsampled(self) -> str | None:
        """Why a sampler started with the launch (attribution=) cannot see every rank, or None: it follows the
        launch command's descendants on this node, which the ranks are unless a scheduler or another node starts
        them."""
        if self.scheduler is not None:
            return (f"launcher={self.spec.launcher}: {self.scheduler} starts the ranks (its own daemons), outside the "
                    "launch command's processes")
        if self.spec.across_nodes:
            return f"nodes={self.spec.nodes}: the other nodes' ranks are not processes of this node"
        return None

    def per_node_command(self, argv: list[str]) -> list[str] | None:
        """argv once on every node of the launch, or None where the launch has one node (argv then runs here)."""
        return None

    def task_verdicts(self, log: str) -> dict[int, str]:
        """rank -> how the launcher says its task ended ("Killed"), read from a launch's log; empty if it says none."""
        return {}

    # ---- batch jobs -------------------------------------------------------------------------------------------
    script_name: ClassVar[str | None] = None  # job.sbatch, job.pbs

    def job_script(self, run_dir: Path, job_args: list[str] | None = None) -> str:
        """The batch script's text (a scheduler's launcher only)."""
        raise NotImplementedError(f"launcher {self.name} submits no batch jobs")

    def submit(self, script: Path) -> str:
        """Submit the batch script; returns the job id (RunFailed when the scheduler refuses it)."""
        raise NotImplementedError(f"launcher {self.name} submits no batch jobs")

    # the scheduler's words for a job that has ended (it may keep listing it for a while)
    ended_states: ClassVar[frozenset[str]] = frozenset()

    def job_state(self, job_id: str) -> str | None:
        """The scheduler's state of a submitted job ("PENDING", "RUNNING", ...), or None once it no longer knows
        the job (ended and forgotten): wait=true follows a job with it."""
        raise NotImplementedError(f"launcher {self.name} submits no batch jobs")

    # ---- the predictor ----------------------------------------------------------------------------------------
    @property
    def calibration_key(self) -> str:
        """Whose launch-phase coefficients the predictor fits and uses."""
        return self.name


def job_name(run_dir: Path, limit: int) -> str:
    """A scheduler's job name for a run (PBS: at most 15 characters, starting with a letter)."""
    name = "rh-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.name)
    return name[:limit]


def job_body(spec, run_dir: Path, job_args: list[str]) -> list[str]:
    """A batch job's commands: `python -m restart_harness.phases.job RUN_DIR` does inside the allocation what a run
    here does (checkpoint launch, page cache, restart launch, finalize). The Python that submitted the job runs it
    (clusters share the file system); env_hook= is sourced by the job script and by every launch script."""
    lines = ["set -euo pipefail", f"cd {shlex.quote(str(SOURCE_ROOT))}"]
    if spec.env_hook:  # the harness's own Python may need the modules too (shared libraries); ranks source it again
        lines.append(f"source {shlex.quote(spec.env_hook)}  # env_hook: modules, conda, ...")
    return lines + ["exec " + shell_line([sys.executable, "-m", JOB_MODULE, str(run_dir), *job_args])]


JOB_COMMENT = "# restart-harness job, generated: checkpoint launch, page cache, restart launch, finalize"
