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


def cuda_device(env: MutableMapping[str, str] | None = None) -> int:
    """The CUDA device index this rank takes: its local rank among the devices the launcher made visible to it.
    Where the scheduler binds one device a task (CUDA_VISIBLE_DEVICES holds one), that one: index 0."""
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", "0"))
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return 0 if len(visible) == 1 else local_rank


def main() -> int:
    """`python -m restart_harness.worker.rank_env` in place of a rank: what it would see and take (its rank
    variables, the devices the launcher made visible, the CUDA device index), as one JSON line."""
    import json
    import socket

    fill()
    seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                                           "CROSS_SIZE", "CUDA_VISIBLE_DEVICES")}
    seen.update({k: v for k, v in os.environ.items() if k.endswith("GPUS_ON_NODE")})  # Slurm, Flux: the node's count
    print(json.dumps({"host": socket.gethostname(), **seen, "cuda_device": cuda_device()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
