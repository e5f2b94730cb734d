"""launcher=torchrun: torch.distributed.run on this node; a rank that dies makes it end the others. It sets RANK,
LOCAL_RANK, WORLD_SIZE, GROUP_RANK and LOCAL_WORLD_SIZE, not DeepSpeed's CROSS_* and LOCAL_SIZE (filled from its
own). Inside a Slurm allocation with nodes > 1: one torchrun per node through srun, each told its node's rank and
the allocation's first host as a static rendezvous (node i runs ranks i*R .. i*R+R-1)."""

from __future__ import annotations

import shlex
import sys
from typing import ClassVar

from restart_harness.errors import UsageError
from restart_harness.launchers import _slurm
from restart_harness.launchers.base import WORKER_MODULE, Launcher


class TorchrunLauncher(Launcher):
    name = "torchrun"
    description = ("torch.distributed.run on this node; with nodes > 1 inside a Slurm allocation, one torchrun per "
                   "node through srun")
    rank_variables: ClassVar[dict[str, tuple[str, ...]]] = {"CROSS_RANK": ("GROUP_RANK",), "LOCAL_SIZE": ("LOCAL_WORLD_SIZE",)}
    subset = True
    port_here = True

    def preflight(self) -> None:
        spec = self.spec
        if spec.nodes > 1 and not spec.subset and not _slurm.inside_allocation():
            raise UsageError(f"nodes={spec.nodes} with launcher={spec.launcher}: outside a Slurm allocation it starts "
                             "ranks on this node only; accepted: nodes=1, launcher=slurm|pbs for several nodes, or "
                             "this launcher inside a Slurm allocation (salloc)")
        super().preflight()

    def needs(self) -> list[str]:
        return list(_slurm.PROGRAMS) if self.spec.across_nodes and _slurm.inside_allocation() else []

    def rank_command(self, port: int, args: list[str]) -> list[str]:
        spec = self.spec
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

    def script_lines(self, port: int) -> list[str]:
        return [*_slurm.RENDEZVOUS, f"export MASTER_ADDR MASTER_PORT={port}"] if self.spec.across_nodes else []

    def per_node_command(self, argv: list[str]) -> list[str] | None:
        return _slurm.per_node(self.spec.nodes, argv) if self.spec.across_nodes else None

    def task_verdicts(self, log: str) -> dict[int, str]:
        return _slurm.task_verdicts(log) if self.spec.across_nodes else {}
