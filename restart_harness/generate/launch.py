"""Launch scripts: the exact commands that start the ranks of one phase, written into the run directory.

The command and the lines before it are the launcher's (restart_harness/launchers/, one module per `launcher=`);
this module adds what every rank gets whatever started it (threads, the JIT cache, the I/O instrumentation, the
env hook) and writes a script that re-runs the launch by hand.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from restart_harness import SOURCE_ROOT, launchers
from restart_harness.spec.runspec import RunSpec
from restart_harness.storage.cache_dir import extensions_dir


def rank_environment(spec: RunSpec) -> dict[str, str]:
    """Environment every rank gets. DeepSpeed's JIT-built ops are cached in the user cache directory."""
    env = {
        # threads is resolved on the node that starts the ranks (machine.py); a script written before that (a batch
        # job's, at submission) is written again inside the job
        "OMP_NUM_THREADS": str(spec.threads or 1),
        "PYTHONUNBUFFERED": "1",
        "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
        **launchers.of(spec).environment(),  # RH_LAUNCHER: whose rank variables the ranks read (worker/rank_env.py)
    }
    if spec.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env


def worker_args(run_dir: Path, phase: str, record: str) -> list[str]:
    return ["--run-dir", str(run_dir), "--phase", phase, "--record", record]


def launch_script(spec: RunSpec, phase: str, command: list[str], port: int | None = None,
                  observe: dict[str, str] | None = None) -> str:
    """A self-contained bash script: re-running it by hand (inside the job, for slurm/pbs) repeats the launch.
    `command`: the launcher's rank_command; `observe`: the I/O instrumentation's environment (launch/observe.py);
    its LD_PRELOAD keeps any existing one."""
    launcher = launchers.of(spec)
    env = rank_environment(spec)
    observe = dict(observe or {})
    preload = observe.pop("LD_PRELOAD", None)
    env.update(observe)
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
    lines += launcher.script_lines(port)
    lines.append(("exec " if launcher.execs() else "") + launchers.shell_line(command))
    return "\n".join(lines) + "\n"
