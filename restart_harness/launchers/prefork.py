"""launcher=prefork: one Python process imports the training stack's libraries, then forks the ranks on this node.

A rank's process start is the forking process's start: its `imports` phase is that one process's imports, paid once
for the node instead of once per rank on shared cores. It is the cheapest way to start ranks here (per rank, a fork
instead of an interpreter importing torch and DeepSpeed: measured in docs/testing.md), and the shape of a
restart whose ranks are started from a process that had its libraries loaded before it forked (a zygote or a warm
standby), beside the launchers that start every rank from nothing. The forked ranks are fresh processes in what
matters to a restart: the forking process never builds a model or touches a checkpoint, and a phase's launch starts
a new one.

Like DeepSpeed's launcher it sets RANK, LOCAL_RANK, WORLD_SIZE, CROSS_RANK, CROSS_SIZE and LOCAL_SIZE itself. A rank
that ends with an error ends the others (as srun --kill-on-bad-exit does), and the launch exits with its code."""

from __future__ import annotations

import sys

from restart_harness.errors import UsageError
from restart_harness.launchers.base import Launcher

MODULE = "restart_harness.worker.forker"  # the forking process: the in-rank half of this launcher


class PreforkLauncher(Launcher):
    name = "prefork"
    description = ("one process imports the stack's libraries, then forks the ranks on this node (the cheapest start; "
                   "the imports are paid once for the node)")
    forks_ranks = True

    def preflight(self) -> None:
        spec = self.spec
        if spec.across_nodes:
            raise UsageError(f"nodes={spec.nodes} with launcher=prefork: it forks ranks on this node only; accepted: "
                             "nodes=1, or launcher=slurm|pbs for several nodes")

    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        return (["export MASTER_ADDR=127.0.0.1", f"export MASTER_PORT={port}"],
                [sys.executable, "-m", MODULE, str(self.spec.launched_ranks), *args])
