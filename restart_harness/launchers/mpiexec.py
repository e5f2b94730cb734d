"""launcher=mpiexec: plain `mpiexec -n N` (Open MPI or MPICH) on this node, outside any scheduler. It starts the
processes and sets its own rank variables (Open MPI: OMPI_COMM_WORLD_*; MPICH's Hydra: PMI_RANK, PMI_SIZE,
MPI_LOCALRANKID, MPI_LOCALNRANKS); the ranks never call MPI, they rendezvous over torch.distributed on this node.
A rank that exits with an error makes mpiexec end the others."""

from __future__ import annotations

import sys

from restart_harness.errors import UsageError
from restart_harness.launchers.base import WORKER_MODULE, Launcher, exports, require

# mpiexec's rank variables by implementation (launcher=pbs's too): Cray PALS (ALCF Polaris), MPICH's Hydra, Open MPI
RANK_VARIABLES = {
    "RANK": ("PALS_RANKID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"),
    "WORLD_SIZE": ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"),
    "LOCAL_RANK": ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "LOCAL_SIZE": ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    # Open MPI has no node index (its OMPI_COMM_WORLD_NODE_RANK is the rank within the node): rank_env.py
    # derives it as RANK // LOCAL_SIZE, true of mpiexec's default placement (by slot: a node's ranks are consecutive)
    "CROSS_RANK": ("PALS_NODEID",)}

# Open MPI refuses root without both, refuses more processes than cores without oversubscription, and binds each
# process to one core when it starts two or fewer (a rank's threads would share it); MPICH ignores these variables
OPEN_MPI_SETTINGS = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none"}


class MpiexecLauncher(Launcher):
    name = "mpiexec"
    description = "mpiexec -n N (Open MPI or MPICH) on this node; its rank variables, no scheduler"
    rank_variables = RANK_VARIABLES

    def preflight(self) -> None:
        spec = self.spec
        if spec.across_nodes:
            raise UsageError(f"nodes={spec.nodes} with launcher=mpiexec: it starts ranks on this node only; accepted: "
                             "nodes=1, or launcher=slurm|pbs for several nodes")
        require(self, [] if spec.dry_run else ["mpiexec"], "install Open MPI or MPICH (Debian: apt-get install "
                "openmpi-bin), launcher=local, launcher=torchrun", "the launch scripts")

    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        return ([*exports(OPEN_MPI_SETTINGS), "export MASTER_ADDR=127.0.0.1", f"export MASTER_PORT={port}"],
                ["mpiexec", "-n", str(self.spec.launched_ranks), sys.executable, "-m", WORKER_MODULE, *args])
