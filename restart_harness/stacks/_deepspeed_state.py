"""The DeepSpeed stack's state, digested (helpers of stacks/deepspeed.py).

state_digests(): what one rank restores - module weights (ZeRO-3: its partition of each), its ZeRO fp32 master
partition, optimizer moments and step, the engine's step counters - compared with the same rank's digests taken at save.

full_state_digests(): the full, unsplit optimizer state of every parameter (fp32 master weights, Adam's exp_avg and
exp_avg_sq), whatever the layout holds it as: gathered over the data-parallel group by DeepSpeed's own safe_get_full_*
functions, then over the tensor-parallel group and put back together by each parameter's split
(restart_harness/spec/parameters.py). A restart at another layout compares its digests with the ones taken from the
original checkpoint's files (stacks/_universal.py reference()), so the check holds whatever layout wrote and whatever
layout loaded."""

from __future__ import annotations

import torch
import torch.distributed as dist

from restart_harness.model import digest
from restart_harness.spec import parameters as table

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
CAT_DIM = {"column": 0, "vocab": 0, "row": 1}


def split_of(shape, name: str) -> str:
    """column | row | vocab | replicated, from `<pipeline layer index>.<name within the layer>`."""
    index, _, local = name.partition(".")
    kind = table.pipeline_layers(shape)[int(index)]
    return next(p.split for p in table.layer_params(shape, 1, kind) if p.name == local)


def merge_tp(shards: list[torch.Tensor], split: str) -> torch.Tensor:
    """One parameter's full tensor from its TP shards (replicated: the first, which all must equal)."""
    if split == "replicated" or len(shards) == 1:
        return shards[0]
    return torch.cat(shards, dim=CAT_DIM[split])


def state_digests(engine) -> dict[str, str]:
    """name -> digest for every tensor this rank restores: module weights, ZeRO fp32 master partition,
    optimizer moments and step, and the engine's step counters."""
    out = {f"module.{name}": t for name, t in engine.module.state_dict().items()}
    for name, p in engine.module.named_parameters():  # ZeRO-3: the module holds only this rank's partitions
        if getattr(p, "ds_tensor", None) is not None:
            out[f"module_partition.{name}"] = p.ds_tensor
    zero = engine.optimizer
    inner = getattr(zero, "optimizer", zero)
    masters = getattr(zero, "single_partition_of_fp32_groups", None)
    params = masters if masters is not None else [p for g in inner.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        out[f"optimizer.master.{i}"] = p
        for key, value in sorted(inner.state.get(p, {}).items()):
            out[f"optimizer.state.{i}.{key}"] = value
    out["engine.global_steps"] = engine.global_steps
    out["engine.global_samples"] = engine.global_samples
    return digest.digests(out)  # every sum queued, then read once


def full_state_digests(engine, module, spec, grid) -> dict[str, dict[str, str]]:
    """name -> {fp32, exp_avg, exp_avg_sq: digest} of every parameter this rank's stage holds, at full size.
    Every rank takes part in the gathers; TP rank 0 of DP rank 0 of each stage returns the digests, the others {}."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    tp_group, tp_rank, tp = grid.get_slice_parallel_group(), grid.get_slice_parallel_rank(), spec.tp
    reporter = tp_rank == 0 and grid.get_data_parallel_rank() == 0
    out: dict[str, dict[str, str]] = {}
    for name, param in module.named_parameters():
        split = split_of(spec.shape, name)
        for key in KEYS:
            local = safe_get_full_fp32_param(param) if key == "fp32" else safe_get_full_optimizer_state(param, key)
            local = local.detach().float().contiguous()
            shards = [local]
            if tp > 1:
                shards = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(shards, local, group=tp_group)
            if reporter:
                out.setdefault(name, {})[key] = digest.tensor_digest(merge_tp(shards, split))
    return out
