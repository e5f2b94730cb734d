"""The interface between the harness and a launcher: what starts the ranks of a phase, chosen once by `launcher=`
(restart_harness/resolve.py). Two views, as submitit pairs an executor with a job environment: Launcher (the launch
script and inside the launch) and, for a batch scheduler's, Scheduler (its job). Each member:
docs/architecture.md (launchers)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from restart_harness import SOURCE_ROOT
from restart_harness.errors import RunFailed, UsageError

WORKER_MODULE = "restart_harness.worker"
JOB_MODULE = "restart_harness.phases.job"


class Raw(str):
    """A command part written into the script unquoted (a shell variable such as "$PBS_NODEFILE")."""


def shell_line(command: list[str]) -> str:
    return " ".join(p if isinstance(p, Raw) else shlex.quote(p) for p in command)


class Scheduler(ABC):
    """A batch scheduler's side of a launcher (Slurm, PBS): the job script, its submission and the job's state, and
    what the scheduler says of the job before it is submitted (`spec`: the RunSpec; read, never changed)."""

    name: ClassVar[str]  # how the harness names the scheduler ("Slurm")
    job_variable: ClassVar[str]  # set inside one of its jobs (SLURM_JOB_ID): the ranks start directly
    script_name: ClassVar[str]  # job.sbatch, job.pbs
    submit_argv: ClassVar[tuple[str, ...]]  # submits the script named after it, printing the job id
    # the scheduler's words for a job that has ended (it may keep listing it for a while)
    ended_states: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec):
        self.spec = spec

    @classmethod
    def inside_job(cls) -> bool:
        """This process already runs inside one of this scheduler's jobs."""
        return bool(os.environ.get(cls.job_variable))

    def preflight(self) -> None:
        """What the scheduler says of the job before it is submitted (Slurm: sinfo and sbatch --test-only)."""

    @abstractmethod
    def job_script(self, run_dir: Path, job_args: list[str] | None = None) -> str:
        """The batch script's text."""

    def submit(self, script: Path) -> str:
        """Submit the batch script; returns the job id (RunFailed when the scheduler refuses it)."""
        proc = subprocess.run([*self.submit_argv, str(script)], check=False, capture_output=True, text=True,
                              cwd=script.parent)
        if proc.returncode != 0:
            raise RunFailed(f"{self.submit_argv[0]} refused {script}: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout.strip().split(";")[0]  # sbatch --parsable: "jobid[;cluster]"

    @abstractmethod
    def job_state(self, job_id: str) -> str | None:
        """The scheduler's state of a submitted job ("PENDING", "RUNNING", ...), or None once it no longer knows
        the job (ended and forgotten): wait=true follows a job with it."""


class Launcher(ABC):
    """What starts one run's ranks (`spec`: the RunSpec; read, never changed): the launch script of each phase, and
    inside the launch."""

    name: ClassVar[str]  # the launcher= value, recorded in spec.json
    aliases: ClassVar[tuple[str, ...]] = ()  # other launcher= values meaning this one
    description: ClassVar[str]  # one line for --help and the docs
    # RANK, WORLD_SIZE, LOCAL_RANK, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE -> the launcher's own variables, in order of
    # preference; a name absent here is one the launcher sets itself (or rank_env.py derives)
    rank_variables: ClassVar[dict[str, tuple[str, ...]]] = {}
    # forks the ranks from one process that imported for them: a node imports once (worker/io_marks.py)
    forks_ranks: ClassVar[bool] = False
    # a batch scheduler whose jobs runs become (typed outside one of its jobs); None: the launch command runs on
    # this node, starts (at least) the first node's ranks here (subset=true) and binds the rendezvous port here
    scheduler: ClassVar[type[Scheduler] | None] = None

    def __init__(self, spec):
        self.spec = spec
        # a refusal may suggest dry_run=true: not to a command that takes none (restart, study: they set it False)
        self.offers_dry_run = spec.phase != "restart"

    @classmethod
    def check(cls, spec) -> None:
        """Pure checks of the keys against this launcher (no machine): UsageError naming the value."""
        from restart_harness.launchers import all_launchers

        if spec.subset and cls.scheduler is not None:
            takers = "|".join(n for n, c in all_launchers().items() if c.scheduler is None)
            raise UsageError(f"subset=true with launcher={spec.launcher}: a subset runs on the node it is started on; "
                             f"accepted: launcher={takers}")
        if spec.wait and cls.scheduler is None:
            takers = "|".join(n for n, c in all_launchers().items() if c.scheduler)
            raise UsageError(f"wait=true with launcher={spec.launcher}: a run started here returns when it ends; "
                             f"accepted: wait=true with launcher={takers}")

    def preflight(self) -> None:
        """The launcher can run from here (the programs it needs are on PATH: require()); UsageError otherwise."""

    @classmethod
    def submits(cls) -> bool:
        """The run becomes a batch job (a scheduler's launcher, from outside one of its jobs)."""
        return cls.scheduler is not None and not cls.scheduler.inside_job()

    @abstractmethod
    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        """The launch script of one phase: the shell lines before the command (rendezvous, host file, exports; a
        `trap` line: the script does not exec the command, so that the trap runs when it ends), and the command that
        starts every rank (`args`: the worker's)."""

    def per_node_command(self, argv: list[str]) -> list[str] | None:
        """argv once on every node of the launch, or None where the launch has one node (argv then runs here)."""
        return None

    def task_verdicts(self, log: str) -> dict[int, str]:
        """rank -> how the launcher says its task ended ("Killed"), read from a launch's log; empty if it says none."""
        return {}


def require(launcher: Launcher, programs: list[str], accepted: str = "launcher=local, launcher=torchrun",
            what: str = "the job script") -> None:
    """UsageError when one of the programs this launch runs on this machine is not on PATH."""
    for program in programs:
        if shutil.which(program) is None:
            raise UsageError(f"launcher={launcher.spec.launcher} needs {program}, which is not installed here (not on "
                             f"PATH); accepted here: {accepted}"
                             + (f", or dry_run=true to only write {what}" if launcher.offers_dry_run else ""))


def exports(variables: dict[str, str]) -> list[str]:
    """Shell lines exporting variables for the ranks."""
    return [f"export {k}={shlex.quote(v)}" for k, v in variables.items()]


def job_name(run_dir: Path, limit: int) -> str:
    """A scheduler's job name for a run (PBS: at most 15 characters, starting with a letter)."""
    return ("rh-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_dir.name))[:limit]


def job_script(spec, run_dir: Path, job_args: list[str] | None, directives: list[tuple[str, object]]) -> str:
    """A batch job's script: the scheduler's directive lines (`#SBATCH --nodes=2`: (prefix, value) pairs, those whose
    value is None or empty left out), then `python -m restart_harness.phases.job RUN_DIR`, which does inside the
    allocation what a run here does (checkpoint launch, page cache, restart launch, finalize). The Python that
    submitted the job runs it (clusters share the file system); env_hook= is sourced by the job script and by every
    launch script."""
    lines = ["#!/usr/bin/env bash", *(f"{prefix}{value}" for prefix, value in directives if value),
             "# restart-harness job, generated: checkpoint launch, page cache, restart launch, finalize",
             "set -euo pipefail", f"cd {shlex.quote(str(SOURCE_ROOT))}"]
    if spec.env_hook:  # the harness's own Python may need the modules too (shared libraries); ranks source it again
        lines.append(f"source {shlex.quote(spec.env_hook)}  # env_hook: modules, conda, ...")
    lines.append("exec " + shell_line([sys.executable, "-m", JOB_MODULE, str(run_dir), *(job_args or [])]))
    return "\n".join(lines) + "\n"
