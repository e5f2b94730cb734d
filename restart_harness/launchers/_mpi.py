"""What mpiexec gives the processes it starts, by implementation: Cray PALS (ALCF Polaris), MPICH's Hydra, Open MPI.
The ranks never call MPI: the harness reads these variables and rendezvouses over torch.distributed."""

from __future__ import annotations

RANK_VARIABLES = {
    "RANK": ("PALS_RANKID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"),
    "WORLD_SIZE": ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"),
    "LOCAL_RANK": ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "LOCAL_SIZE": ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    # Open MPI has no node index (its OMPI_COMM_WORLD_NODE_RANK is the rank within the node): rank_env.py
    # derives it as RANK // LOCAL_SIZE, true of mpiexec's default placement (by slot: a node's ranks are consecutive)
    "CROSS_RANK": ("PALS_NODEID",),
}
