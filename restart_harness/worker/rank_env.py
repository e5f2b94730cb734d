"""Fill the rank variables torch.distributed and DeepSpeed read from whatever the launcher set.

DeepSpeed's launcher sets RANK, WORLD_SIZE, LOCAL_RANK and also CROSS_RANK, CROSS_SIZE, LOCAL_SIZE, which
DeepSpeed's newer checkpoint writers read. torchrun sets only the first three (plus GROUP_RANK and
LOCAL_WORLD_SIZE); srun and mpiexec set none of them, only their own. The launch script says whose variables the
rank reads (RH_LAUNCHER, a launcher's name); each launcher declares them (restart_harness/launchers/, its
rank_variables). Values already present are never overwritten.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from restart_harness import launchers


def fill(env: MutableMapping[str, str] | None = None) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE from the launcher's variables."""
    env = os.environ if env is None else env
    name = env.get(launchers.LAUNCHER_VARIABLE, "")
    sources = launchers.get(name).rank_variables if name else {}
    for variable, candidates in sources.items():
        if variable in env:
            continue
        value = next((env[c] for c in candidates if env.get(c)), None)
        if value is not None:
            # SLURM_NTASKS_PER_NODE may read "2(x3)" on heterogeneous allocations: the count comes first
            env[variable] = value.split("(")[0]
    if "LOCAL_SIZE" in env and "WORLD_SIZE" in env:
        env.setdefault("CROSS_SIZE", str(int(env["WORLD_SIZE"]) // int(env["LOCAL_SIZE"])))
        if "RANK" in env:
            env.setdefault("CROSS_RANK", str(int(env["RANK"]) // int(env["LOCAL_SIZE"])))
