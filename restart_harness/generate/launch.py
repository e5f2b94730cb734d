"""Launch scripts: the exact commands that start the ranks of one phase, written into the run directory.

One command builder per launcher (the `launcher=` key):
  local     DeepSpeed's own launcher on this node (sets CROSS_RANK/CROSS_SIZE/LOCAL_SIZE itself)
  torchrun  torch.distributed.run on this node; with nodes > 1 inside a Slurm allocation, one per node via srun
  slurm     srun inside the job's allocation; MASTER_ADDR is the allocation's first host
  pbs       mpiexec over $PBS_NODEFILE (ALCF Polaris style); MASTER_ADDR is its first host
torchrun, srun and mpiexec do not set the variables DeepSpeed's newer checkpoint writers read; the worker fills
them from the launcher's own (restart_harness/worker/rank_env.py, told which launcher by RH_LAUNCHER).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from restart_harness import SOURCE_ROOT
from restart_harness.spec.runspec import RunSpec
from restart_harness.storage.cache_dir import extensions_dir

WORKER_MODULE = "restart_harness.worker"


class Raw(str):
    """A command part written into the script unquoted (a shell variable such as "$PBS_NODEFILE")."""


def rank_environment(spec: RunSpec) -> dict[str, str]:
    """Environment every rank gets. DeepSpeed's JIT-built ops are cached in the user cache directory."""
    env = {
        # threads is resolved on the node that starts the ranks (machine.py); a script written before that (a batch
        # job's, at submission) is written again inside the job
        "OMP_NUM_THREADS": str(spec.threads or 1),
        "PYTHONUNBUFFERED": "1",
        "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
        # DeepSpeed's multi-node slurm launch starts the ranks as plain srun tasks: their variables are Slurm's
        "RH_LAUNCHER": "slurm" if spec.launcher == "local" and spec.across_nodes else spec.launcher,
    }
    if spec.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env


def worker_args(run_dir: Path, phase: str, record: str) -> list[str]:
    return ["--run-dir", str(run_dir), "--phase", phase, "--record", record]


def on_slurm_nodes(spec: RunSpec) -> bool:
    """The ranks start as srun tasks on the allocation's nodes: launcher=slurm, or DeepSpeed's launcher or torchrun
    with nodes > 1 (allowed inside a Slurm allocation only: preflight)."""
    return spec.launcher == "slurm" or (spec.launcher in ("local", "torchrun") and spec.across_nodes)


def local_command(spec: RunSpec, port: int, args: list[str]) -> list[str]:
    """DeepSpeed's own launcher on this node (sets CROSS_RANK/CROSS_SIZE/LOCAL_SIZE, unlike torchrun). With nodes > 1
    (inside a Slurm allocation): DeepSpeed's own multi-node launch without ssh, its slurm launcher over a hostfile of
    the allocation's first nodes; it runs `srun -n <ranks> python -u <script>`, setting no rank variables, so the
    worker takes them from Slurm's (RH_LAUNCHER=slurm) and is given as a script (the launcher has no --module)."""
    if spec.across_nodes:
        return [
            sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", Raw('"$RH_HOSTFILE"'),
            "--launcher", "slurm", "--no_ssh_check", "--num_nodes", str(spec.nodes),
            "--master_addr", Raw('"$MASTER_ADDR"'), "--master_port", str(port),
            str(SOURCE_ROOT / "restart_harness" / "worker" / "__main__.py"), *args,
        ]
    return [
        sys.executable, "-m", "deepspeed.launcher.runner",
        "--num_nodes", "1", "--num_gpus", str(spec.ranks_per_node),
        "--master_port", str(port),
        "--no_local_rank", "--module", WORKER_MODULE, *args,
    ]


def torchrun_command(spec: RunSpec, port: int, args: list[str]) -> list[str]:
    """torch.distributed.run on this node; a rank that dies makes it end the others. With nodes > 1 (inside a Slurm
    allocation): one torchrun per node through srun, each told its node's rank (SLURM_NODEID, expanded on the node)
    and the allocation's first host as the rendezvous (a static one: node i runs ranks i*R .. i*R+R-1)."""
    if not spec.across_nodes:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc-per-node", str(spec.ranks_per_node),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--module", WORKER_MODULE, *args,
        ]
    per_node = " ".join([
        "exec", *map(shlex.quote, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(spec.nodes)]),
        '--node-rank "$SLURM_NODEID"',
        *map(shlex.quote, ["--nproc-per-node", str(spec.ranks_per_node)]),
        '--master-addr "$MASTER_ADDR"',
        *map(shlex.quote, ["--master-port", str(port), "--module", WORKER_MODULE, *args]),
    ])
    return ["srun", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", "bash", "-c", per_node]


def srun_command(spec: RunSpec, port: int, args: list[str]) -> list[str]:
    """One srun step over the job's allocation; --kill-on-bad-exit ends every rank when one fails."""
    return [
        "srun", f"--nodes={spec.nodes}", f"--ntasks={spec.world_size}", f"--ntasks-per-node={spec.ranks_per_node}",
        "--kill-on-bad-exit=1", sys.executable, "-m", WORKER_MODULE, *args,
    ]


def mpiexec_command(spec: RunSpec, port: int, args: list[str]) -> list[str]:
    """mpiexec over PBS's node file (Cray PALS / MPICH option names, as on ALCF Polaris)."""
    return [
        "mpiexec", "-n", str(spec.world_size), "--ppn", str(spec.ranks_per_node),
        "--hostfile", Raw('"$PBS_NODEFILE"'), sys.executable, "-m", WORKER_MODULE, *args,
    ]


COMMANDS = {"local": local_command, "torchrun": torchrun_command, "slurm": srun_command, "pbs": mpiexec_command}

# Lines run before the command: where the rendezvous is (DeepSpeed's and torchrun's launchers do it themselves).
_RENDEZVOUS = {
    "slurm": ['MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"'],
    "pbs": ['MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"'],
}


def per_node_command(spec: RunSpec, argv: list[str]) -> list[str] | None:
    """argv once on every node of the job (slurm, pbs: inside the allocation), or None for a one-node launcher."""
    if on_slurm_nodes(spec):
        return ["srun", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}", "--ntasks-per-node=1", *argv]
    if spec.launcher == "pbs":
        return ["mpiexec", "-n", str(spec.nodes), "--ppn", "1", "--hostfile", os.environ.get("PBS_NODEFILE", ""),
                *argv]
    return None


def rank_command(spec: RunSpec, port: int, args: list[str]) -> list[str]:
    """The command that starts every rank of one phase with spec.launcher."""
    return COMMANDS[spec.launcher](spec, port, args)


def launch_script(spec: RunSpec, phase: str, command: list[str], port: int | None = None,
                  observe: dict[str, str] | None = None) -> str:
    """A self-contained bash script: re-running it by hand (inside the job, for slurm/pbs) repeats the launch.
    `observe`: the I/O instrumentation's environment (launch/observe.py); its LD_PRELOAD keeps any existing one."""
    env = rank_environment(spec)
    observe = dict(observe or {})
    preload = observe.pop("LD_PRELOAD", None)
    env.update(observe)
    lines = [
        "#!/usr/bin/env bash",
        f"# restart-harness {phase} launch ({spec.launcher}), generated; re-run by hand to repeat it.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(SOURCE_ROOT))}  # python -m finds the harness here, installed or not",
    ]
    if spec.env_hook:
        lines.append(f"source {shlex.quote(spec.env_hook)}  # env_hook: modules, conda, ...")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    if preload:
        lines.append(f'export LD_PRELOAD={shlex.quote(preload)}"${{LD_PRELOAD:+ $LD_PRELOAD}}"')
    rendezvous = "slurm" if on_slurm_nodes(spec) else spec.launcher
    if rendezvous in _RENDEZVOUS:
        lines += _RENDEZVOUS[rendezvous]
        lines.append(f"export MASTER_ADDR MASTER_PORT={port}")
    if spec.launcher == "local" and spec.across_nodes:  # DeepSpeed's hostfile: the allocation's first nodes
        lines += [
            'RH_HOSTFILE="$(mktemp "${TMPDIR:-/tmp}/rh-hostfile.XXXXXX")"',
            "trap 'rm -f \"$RH_HOSTFILE\"' EXIT",
            (f'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n {spec.nodes} '
             f"| sed 's/$/ slots={spec.ranks_per_node}/' > \"$RH_HOSTFILE\""),
        ]
    # exec, except where the hostfile is to be removed when the launch ends (an exec'd shell runs no trap)
    run = "" if spec.launcher == "local" and spec.across_nodes else "exec "
    lines.append(run + " ".join(p if isinstance(p, Raw) else shlex.quote(p) for p in command))
    return "\n".join(lines) + "\n"
