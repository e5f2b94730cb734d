"""Launch scripts: the exact commands that start the ranks of one phase (the launcher's, restart_harness/launchers/,
with what every rank gets whatever started it), written into the run directory to be re-run by hand, and a batch
scheduler's job script."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from restart_harness import SOURCE_ROOT, rank_env
from restart_harness.files.atomic import write_text_atomic
from restart_harness.files.cache_dir import extensions_dir
from restart_harness.launchers import shell_line
from restart_harness.resolve import Plugins, Run
from restart_harness.rundir import observe


def worker_args(run_dir: Path, phase: str, record: str) -> list[str]:
    return ["--run-dir", str(run_dir), "--phase", phase, "--record", record]


def launch_script(plugins: Plugins, phase: str, launch: tuple[list[str], list[str]],
                  observed: dict[str, str] | None = None) -> str:
    """A self-contained bash script: re-running it by hand (inside the job, for slurm/pbs) repeats the launch.
    `launch`: the launcher's lines and command (Launcher.launch); `observed`: the I/O instrumentation's environment
    (rundir/observe.py); its LD_PRELOAD keeps any existing one. Every rank's threads (resolved on the node that starts the ranks,
    machine.py: a batch job's script is written again inside the job), its JIT-built ops' cache and rank variables."""
    spec, launcher = plugins.spec, plugins.launcher
    observed = dict(observed or {})
    preload = observed.pop("LD_PRELOAD", None)
    env = {"OMP_NUM_THREADS": str(spec.threads or 1), "PYTHONUNBUFFERED": "1",
           "TORCH_EXTENSIONS_DIR": str(extensions_dir())}
    if launcher.rank_variables:  # where the ranks find their rank variables (rank_env.py)
        env[rank_env.VARIABLE] = rank_env.encode(launcher.rank_variables)
    if spec.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    env.update(observed)
    lines = [
        "#!/usr/bin/env bash",
        f"# restart-harness {phase} launch ({spec.launcher}), generated; re-run by hand to repeat it.",
        f"# launcher={spec.launcher}: {launcher.description}",
        "set -euo pipefail",
        f"cd {shlex.quote(str(SOURCE_ROOT))}  # python -m finds the harness here, installed or not",
    ]
    if spec.env_hook:
        lines.append(f"source {shlex.quote(spec.env_hook)}  # env_hook: modules, conda, ...")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    if preload:
        lines.append(f'export LD_PRELOAD={shlex.quote(preload)}"${{LD_PRELOAD:+ $LD_PRELOAD}}"')
    before, command = launch
    lines += before  # a trap among them must run when the command ends: no exec then
    lines.append(("" if any(line.startswith("trap ") for line in before) else "exec ") + shell_line(command))
    return "\n".join(lines) + "\n"


def write_launch(run: Run, phase: str, record: str, port: int, extra: list[str] | None = None,
                 staged=None) -> Path:
    """launch-<record>.sh: the ranks of one phase of `run` (its spec: the record's own, for a restart at another
    layout or with another launcher; staged: the environment's copy they run from, env_stage=, envstage.py)."""
    before, command = run.launcher.launch(port, worker_args(run.run_dir, phase, record) + (extra or []))
    if staged is not None:  # every interpreter the launch starts is the copy's
        command = [staged.python if part == sys.executable else part for part in command]
    path = run.run_dir / f"launch-{record}.sh"
    env = {**observe.environment(run.spec, run.run_dir, record, run.checkpoint_root, staged),
           **run.stored.launch_environment(run.run_dir / "logs" / "client" / record)}
    write_text_atomic(path, launch_script(run, phase, (before, command), env), mode=0o755)
    return path


def write_job_script(run: Run, job_args: list[str] | None = None, name: str | None = None) -> Path:
    """The batch scheduler's script of the run (a restart-only job's under `name`)."""
    scheduler = run.scheduler
    (run.run_dir / "logs").mkdir(exist_ok=True)  # the scheduler writes the job's output there
    path = run.run_dir / (name or scheduler.script_name)
    write_text_atomic(path, scheduler.job_script(run.run_dir, job_args), mode=0o755)
    return path


def show_generated(run_dir: Path) -> None:
    """Print every generated file (dry_run=true)."""
    for path in [run_dir / "ds_config.json", *sorted(run_dir.glob("launch-*.sh")), *sorted(run_dir.glob("job.*"))]:
        print(f"==> {path} <==")
        print(path.read_text().rstrip())
