"""Inside a Slurm allocation: what srun gives its tasks and says of them. Used by launcher=slurm and by the launchers
that start ranks across the nodes of an allocation through srun (DeepSpeed's slurm launcher, one torchrun per
node)."""

from __future__ import annotations

import os
import re
import subprocess

from restart_harness.errors import UsageError
from restart_harness.launchers.base import Launcher, require

JOB_VARIABLE = "SLURM_JOB_ID"
# the rank variables of an srun task (rank_env.py)
RANK_VARIABLES = {
    "RANK": ("SLURM_PROCID",), "WORLD_SIZE": ("SLURM_NTASKS",), "LOCAL_RANK": ("SLURM_LOCALID",),
    "CROSS_RANK": ("SLURM_NODEID",), "CROSS_SIZE": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "LOCAL_SIZE": ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")}
PROGRAMS = ["srun", "scontrol"]
# the allocation's first host is the rendezvous
RENDEZVOUS = ['MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"']


def inside_allocation() -> bool:
    return bool(os.environ.get(JOB_VARIABLE))


def per_node(nodes: int, argv: list[str]) -> list[str]:
    """argv once on each of the allocation's first `nodes` nodes."""
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", *argv]


_SRUN_TASKS = re.compile(r"^srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<how>.+?)\s*$", re.MULTILINE)


def task_verdicts(log: str) -> dict[int, str]:
    """rank -> how srun says its task ended ("Killed", "Terminated", "Exited with exit code 1"), from a launch's
    log ("srun: error: node2: tasks 2-3: Killed")."""
    out = {}
    for m in _SRUN_TASKS.finditer(log):
        for part in m["tasks"].split(","):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                out[rank] = m["how"]
    return out


# sinfo's short states of nodes that can take a job (allocated and completing ones free up); any flag '*' (not
# responding) or a down, drained, failed or unknown state cannot
_USABLE = {"idle", "mix", "alloc", "comp", "resv", "plnd", "mix-", "idle~", "idle#", "alloc#"}


def _sinfo(*args: str) -> str:
    proc = subprocess.run(["sinfo", "-h", *args], capture_output=True, text=True, check=False, timeout=60)
    return proc.stdout if proc.returncode == 0 else ""


def nodes(partition: str | None) -> tuple[int, int, list[str]]:
    """(nodes that can run a job, nodes listed, "node4 down* (Not responding)" for the others) of a partition
    (default: Slurm's default partition), from sinfo; (0, 0, []) when sinfo gives nothing."""
    if not partition:
        partition = next((p[:-1] for p in _sinfo("-o", "%P").split() if p.endswith("*")), None)
    lines = _sinfo("-N", "-o", "%N|%t|%E", *(["-p", partition] if partition else [])).splitlines()
    states = {node: (state, why) for node, state, why in ((line.split("|") + ["", ""])[:3] for line in lines)}
    bad = [f"{n} {st}" + (f" ({why})" if why and why != "none" else "")
           for n, (st, why) in sorted(states.items()) if st not in _USABLE]
    return len(states) - len(bad), len(states), bad


def gpus_per_node(partition: str | None) -> dict[str, int]:
    """node -> the GPUs Slurm has for it (generic resources `gpu`, any type), from sinfo; {} when sinfo says
    nothing. "gpu:a100:4(S:0-1),gpu:h100:2" counts 6."""

    def gpus(gres: str) -> int:
        fields = [entry.split("(")[0].split(":") for entry in re.split(r",(?![^(]*\))", gres)]
        return sum(int(f[-1]) for f in fields if f[0] == "gpu" and f[-1].isdigit())

    lines = _sinfo("-N", "-o", "%N|%G", *(["-p", partition] if partition else [])).splitlines()
    return {node: gpus(gres) for node, _, gres in (line.partition("|") for line in lines)}


class SpansAllocation(Launcher):
    """A launcher that starts ranks on this node and, inside a Slurm allocation with nodes > 1, on the allocation's
    nodes through srun (DeepSpeed's launcher, torchrun): there srun's programs, per-node steps and verdicts are its."""

    def preflight(self) -> None:
        spec = self.spec
        if spec.nodes > 1 and not spec.subset and not inside_allocation():
            raise UsageError(f"nodes={spec.nodes} with launcher={spec.launcher}: outside a Slurm allocation it starts "
                             "ranks on this node only; accepted: nodes=1, launcher=slurm|pbs for several nodes, or "
                             "this launcher inside a Slurm allocation (salloc)")
        require(self, list(PROGRAMS) if spec.across_nodes and inside_allocation() else [])

    def per_node_command(self, argv: list[str]) -> list[str] | None:
        return per_node(self.spec.nodes, argv) if self.spec.across_nodes else None

    def task_verdicts(self, log: str) -> dict[int, str]:
        return task_verdicts(log) if self.spec.across_nodes else {}
