"""Inside a rank: the rank variables torch.distributed and DeepSpeed read (RANK, WORLD_SIZE, LOCAL_RANK, CROSS_RANK,
CROSS_SIZE, LOCAL_SIZE), filled from whatever the launcher set, and the CUDA device the rank takes. Standard library
only, imported before anything else in a rank. Each launcher declares where its ranks find them (its
rank_variables; docs/clusters.md), and its launch script exports that declaration (VARIABLE:
`RANK=SLURM_PROCID;LOCAL_SIZE=SLURM_NTASKS_PER_NODE,SLURM_TASKS_PER_NODE;...`). Values already present are never
overwritten. all_reduce: the one min / max collective the stacks and the engines share (imported on call: torch)."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

VARIABLE = "RH_RANK_VARIABLES"


def encode(sources: Mapping[str, tuple[str, ...]]) -> str:
    """A launcher's rank_variables as one environment value."""
    return ";".join(f"{name}={','.join(candidates)}" for name, candidates in sources.items())


def decode(text: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for part in filter(None, text.split(";")):
        name, _, candidates = part.partition("=")
        out[name] = tuple(c for c in candidates.split(",") if c)
    return out


def fill(env: MutableMapping[str, str] | None = None) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE from the launcher's variables."""
    env = os.environ if env is None else env
    for variable, candidates in decode(env.get(VARIABLE, "")).items():
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


def cuda_device(env: Mapping[str, str] | None = None) -> int:
    """The CUDA device index this rank takes: its local rank among the devices the launcher made visible to it.
    Where the scheduler binds one device a task (CUDA_VISIBLE_DEVICES holds one), that one: index 0."""
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", "0"))
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return 0 if len(visible) == 1 else local_rank


def main() -> int:
    """`python -m restart_harness.rank_env` in place of a rank: what it would see and take (its rank variables, the
    devices the launcher made visible, the CUDA device index), as one JSON line."""
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


def all_reduce(values: list[float], op: str, group=None, device=None) -> list[float]:
    """A collective over `group` (None: every rank): each value's min (op "min") or max ("max") over its ranks, as
    float64, on `device` (None: the current CUDA device where the group's backend is NCCL, else the host)."""
    import torch
    import torch.distributed as dist

    if device is None and dist.get_backend(group) == "nccl":
        device = torch.cuda.current_device()
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN, group=group)
    return tensor.tolist()


# the collectives a rank's checkpoint manager needs, on the default process group every stack here joins
def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def all_true(flag: bool, device=None) -> bool:
    """True when flag is True on every rank."""
    return bool(all_reduce([1.0 if flag else 0.0], "min", device=device)[0])


def max_of(value: float, device=None) -> float:
    """The largest value over the ranks."""
    return all_reduce([value], "max", device=device)[0]


def sync(device) -> None:
    """Wait for queued device work (a timer that stops while it is queued measures nothing): CUDA only."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
