"""Launch scripts: the exact commands that start the ranks of one phase, written into the run directory."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from restart_harness import REPO_ROOT
from restart_harness.spec.runspec import RunSpec

WORKER_MODULE = "restart_harness.worker"


def rank_environment(spec: RunSpec) -> dict[str, str]:
    """Environment every rank gets. The JIT-built DeepSpeed ops are cached project-locally."""
    env = {
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions"),
    }
    if spec.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env


def worker_args(run_dir: Path, phase: str, record: str, ckpt_root: Path) -> list[str]:
    return ["--run-dir", str(run_dir), "--phase", phase, "--record", record, "--ckpt-root", str(ckpt_root)]


def local_command(spec: RunSpec, port: int, args: list[str]) -> list[str]:
    """DeepSpeed's own launcher on this node (sets CROSS_RANK/CROSS_SIZE/LOCAL_SIZE, unlike torchrun)."""
    return [
        sys.executable, "-m", "deepspeed.launcher.runner",
        "--num_nodes", "1", "--num_gpus", str(spec.ranks_per_node),
        "--master_port", str(port),
        "--no_local_rank", "--module", WORKER_MODULE, *args,
    ]


def launch_script(spec: RunSpec, phase: str, command: list[str]) -> str:
    """A self-contained bash script: re-running it by hand repeats the launch exactly."""
    env = rank_environment(spec)
    lines = [
        "#!/usr/bin/env bash",
        f"# restart-harness {phase} launch, generated; re-run by hand to repeat it.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(REPO_ROOT))}",
        f'export PYTHONPATH={shlex.quote(str(REPO_ROOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines.append("exec " + " ".join(shlex.quote(part) for part in command))
    return "\n".join(lines) + "\n"
