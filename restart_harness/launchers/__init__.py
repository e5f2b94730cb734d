"""Launchers: what starts a run's ranks (DeepSpeed's launcher, torchrun, mpiexec, a Slurm or PBS job), one module
each holding one subclass of launchers.base.Launcher, discovered here, chosen once by `launcher=` (resolve.py);
nothing outside this package asks which one it is. Importing a launcher module imports no torch."""

from __future__ import annotations

import os
from functools import cache

from restart_harness.errors import UsageError
from restart_harness.launchers.base import Launcher, Raw, shell_line
from restart_harness.plugins import discover


@cache
def all_launchers() -> dict[str, type[Launcher]]:
    return discover(__name__, __path__, Launcher)


def get(name: str) -> type[Launcher]:
    """The launcher `launcher=name` names (its name or an alias); UsageError naming what is accepted."""
    for cls in all_launchers().values():
        if name == cls.name or name in cls.aliases:
            return cls
    accepted = ", ".join(n + "".join(f" (or {a})" for a in c.aliases) for n, c in all_launchers().items())
    raise UsageError(f"launcher={name}: accepted values are {accepted}")


def job_id() -> str | None:
    """The id of the batch job this process runs in, if any."""
    return next((os.environ[c.scheduler.job_variable] for c in all_launchers().values()
                 if c.scheduler and c.scheduler.inside_job()), None)


__all__ = ["Launcher", "Raw", "all_launchers", "get", "job_id", "shell_line"]
