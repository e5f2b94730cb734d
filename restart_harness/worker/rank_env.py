"""Fill the rank variables torch.distributed and DeepSpeed read from whatever the launcher set.

DeepSpeed's launcher sets RANK, WORLD_SIZE, LOCAL_RANK and also CROSS_RANK, CROSS_SIZE, LOCAL_SIZE, which
DeepSpeed's newer checkpoint writers read. torchrun sets only the first three (plus GROUP_RANK and
LOCAL_WORLD_SIZE); srun and mpiexec set none of them, only their own. The launch script says which launcher
started the rank (RH_LAUNCHER); values already present are never overwritten.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# launcher -> (our name, the launcher's variables in order of preference)
_SOURCES = {
    "slurm": {
        "RANK": ("SLURM_PROCID",),
        "WORLD_SIZE": ("SLURM_NTASKS",),
        "LOCAL_RANK": ("SLURM_LOCALID",),
        "CROSS_RANK": ("SLURM_NODEID",),
        "CROSS_SIZE": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
        "LOCAL_SIZE": ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    },
    # Cray PALS (ALCF Polaris), MPICH/Hydra, Open MPI
    "pbs": {
        "RANK": ("PALS_RANKID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"),
        "WORLD_SIZE": ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"),
        "LOCAL_RANK": ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "LOCAL_SIZE": ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        "CROSS_RANK": ("PALS_NODEID", "OMPI_COMM_WORLD_NODE_RANK"),
    },
    "torchrun": {
        "CROSS_RANK": ("GROUP_RANK",),
        "LOCAL_SIZE": ("LOCAL_WORLD_SIZE",),
    },
}


def fill(env: MutableMapping[str, str] | None = None) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE from the launcher's variables."""
    env = os.environ if env is None else env
    for name, candidates in _SOURCES.get(env.get("RH_LAUNCHER", ""), {}).items():
        if name in env:
            continue
        value = next((env[c] for c in candidates if env.get(c)), None)
        if value is not None:
            # SLURM_NTASKS_PER_NODE may read "2(x3)" on heterogeneous allocations: the count comes first
            env[name] = value.split("(")[0]
    if "LOCAL_SIZE" in env and "WORLD_SIZE" in env:
        env.setdefault("CROSS_SIZE", str(int(env["WORLD_SIZE"]) // int(env["LOCAL_SIZE"])))
        if "RANK" in env:
            env.setdefault("CROSS_RANK", str(int(env["RANK"]) // int(env["LOCAL_SIZE"])))
