"""launcher=prefork: one Python process imports the training stack's libraries, then forks the ranks on this node
(worker/forker.py), so a node pays its imports once. Like DeepSpeed's launcher it sets RANK, LOCAL_RANK,
WORLD_SIZE, CROSS_RANK, CROSS_SIZE and LOCAL_SIZE itself; a rank that fails ends the others. docs/architecture.md."""

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
