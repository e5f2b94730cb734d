"""launcher=torchrun: torch.distributed.run on this node; a rank that dies makes it end the others. It sets RANK,
LOCAL_RANK, WORLD_SIZE, GROUP_RANK and LOCAL_WORLD_SIZE, not DeepSpeed's CROSS_* and LOCAL_SIZE (filled from its
own). Inside a Slurm allocation with nodes > 1: one torchrun per node through srun, each told its node's rank and
the allocation's first host as a static rendezvous (node i runs ranks i*R .. i*R+R-1)."""

from __future__ import annotations

import sys
from typing import ClassVar

from restart_harness.launchers import _slurm
from restart_harness.launchers.base import WORKER_MODULE, Raw, shell_line


class TorchrunLauncher(_slurm.SpansAllocation):
    name = "torchrun"
    description = ("torch.distributed.run on this node; with nodes > 1 inside a Slurm allocation, one torchrun per "
                   "node through srun")
    rank_variables: ClassVar[dict[str, tuple[str, ...]]] = {"CROSS_RANK": ("GROUP_RANK",),
                                                             "LOCAL_SIZE": ("LOCAL_WORLD_SIZE",)}

    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        spec, many = self.spec, self.spec.across_nodes
        run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(spec.nodes) if many else "1",
               *([Raw('--node-rank "$SLURM_NODEID"')] if many else []), "--nproc-per-node", str(spec.ranks_per_node),
               "--master-addr", Raw('"$MASTER_ADDR"') if many else "127.0.0.1", "--master-port", str(port),
               "--module", WORKER_MODULE, *args]
        if not many:
            return [], run
        return [*_slurm.RENDEZVOUS, f"export MASTER_ADDR MASTER_PORT={port}"], _slurm.per_node(
            spec.nodes, ["--kill-on-bad-exit=1", "bash", "-c", shell_line(["exec", *run])])
