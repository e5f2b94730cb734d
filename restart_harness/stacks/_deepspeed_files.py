"""DeepSpeed 0.19.8's checkpoint files rebuilt without a model (helpers of stacks/emulated.py): each file's state dict
as DeepSpeed assembles it (engine._save_checkpoint, _save_zero_checkpoint, PipelineModule.save_state_dict, the ZeRO
optimizers' state_dict, with torch's AdamW) from the planner's recipe (plan/checkpoint.py), its tensors' bytes from a
Filler. docs/emulation.md."""

from __future__ import annotations

import collections
import copy
import math

import torch

from restart_harness.plan import checkpoint, rules

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
POOL_BYTES = 64 << 20
BLOCK_BYTES = 4096


class Filler:
    """Incompressible, deduplication-proof tensor bytes, cheap to make: a random pool copied at a per-fill
    offset, with each 4 KiB block's first 8 bytes replaced by a counter unique to (rank, fill, block). A lazy filler
    (streamed emulation, stacks/_streamed.py) leaves each tensor unfilled and records its fill number by storage
    (`fills`); pattern() then makes any stretch of its bytes."""

    def __init__(self, rank: int, seed: int, lazy: bool = False):
        g = torch.Generator().manual_seed(seed * 7919 + rank)
        self.pool = torch.randint(0, 256, (POOL_BYTES,), dtype=torch.uint8, generator=g)
        self.rank, self.lazy = rank, lazy
        self.files = 0
        self.fills: dict[int, int] = {}  # lazy: storage (_cdata) -> its fill number

    def fill(self, t: torch.Tensor) -> torch.Tensor:
        if self.lazy:
            self.fills[t.untyped_storage()._cdata] = self.files
        else:
            raw = t.view(-1).view(torch.uint8)
            self.pattern(self.files, raw.numel(), 0, raw)
        self.files += 1
        return t

    def pattern(self, fill: int, nbytes: int, start: int, out: torch.Tensor) -> None:
        """Bytes [start, start + len(out)) of fill number `fill` of `nbytes` bytes into `out` (start: a multiple of
        4 KiB)."""
        assert start % BLOCK_BYTES == 0
        n, done, offset = out.numel(), 0, (fill * 1_000_003 + start) % POOL_BYTES
        while done < n:
            chunk = min(n - done, POOL_BYTES - offset)
            out[done:done + chunk].copy_(self.pool[offset:offset + chunk])
            done += chunk
            offset = 0
        first, last = start // BLOCK_BYTES, min(nbytes // BLOCK_BYTES, (start + n) // BLOCK_BYTES)
        if last > first:
            stamps = out[: (last - first) * BLOCK_BYTES].view(last - first, BLOCK_BYTES)[:, :8]
            counter = torch.arange(first, last, dtype=torch.int64) + ((self.rank << 48) | (fill << 32))
            stamps.copy_(counter.view(torch.uint8).view(last - first, 8))


# ---- DeepSpeed's state dicts, rebuilt ---------------------------------------------------------------------------
def _ds_objects():
    from deepspeed.git_version_info import version
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return version, LossScaler, ZeroStageEnum, fragment_address


def _adam_param_groups(spec, ds_config: dict) -> list[dict]:
    """torch's own AdamW state_dict param_groups for these hyperparameters (their keys differ across versions)."""
    params = ds_config["optimizer"]["params"]
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=params["lr"], betas=tuple(params["betas"]),
                             eps=params["eps"], weight_decay=params["weight_decay"])
    return adam.state_dict()["param_groups"]


def _flat(spec, recipe: checkpoint.FileRecipe, filler: Filler) -> tuple[torch.Tensor, collections.OrderedDict]:
    """ZeRO's padded flat bf16/fp32 buffer of a shard and the module's parameters as views into it (ZeRO-3: each
    parameter an empty placeholder of its own, its data being in the ranks' partitions)."""
    module, offset = collections.OrderedDict(), 0
    if spec.zero == 3:
        flat = None
        for name, _ in recipe.params:
            module[name] = torch.empty(0, dtype=DTYPES[spec.precision])
    else:
        flat = filler.fill(torch.empty(rules.zero1_flat_numel(recipe.numel, spec.dp), dtype=DTYPES[spec.precision]))
        for name, shape in recipe.params:
            n = math.prod(shape)
            module[name] = flat.narrow(0, offset, n).view(shape)
            offset += n
    # nn.Module.state_dict() records every submodule's version, in registration order, beside the tensors
    metadata = collections.OrderedDict({"": {"version": 1}})
    for name, _ in recipe.params:
        parts = name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            metadata.setdefault(".".join(parts[:i]), {"version": 1})
    module._metadata = metadata
    return flat, module


def _model_state(spec, recipe, filler: Filler, ds_config: dict, client_state: dict) -> dict:
    from deepspeed.checkpoint.constants import CHECKPOINT_PARALLEL_DIMS, CHECKPOINT_PP_DEGREE, CHECKPOINT_TP_DEGREE

    version, *_ = _ds_objects()
    module = None if recipe.pipe else _flat(spec, recipe, filler)[1]
    # DeepSpeed's param_shapes names are other string objects than the module's keys (engine.param_names): fresh
    # copies, so that pickle writes them out again instead of referring back (byte-identical files)
    shapes = collections.OrderedDict((name.encode().decode(), torch.Size(shape)) for name, shape in recipe.params)
    step = client_state["harness_step"]
    frozen = collections.OrderedDict() if spec.zero > 1 else None  # recorded from stage 2 on; no frozen parameters here
    return {"module": module, "buffer_names": [], "optimizer": None, "param_shapes": [shapes],
            "frozen_param_shapes": frozen, "shared_params": {}, "frozen_param_fragments": copy.copy(frozen),
            "lr_scheduler": None, "data_sampler": None, "random_ltd": None, "skipped_steps": 0, "global_steps": step,
            "global_samples": step * spec.global_batch, "dp_world_size": spec.dp, "mp_world_size": spec.tp * spec.pp,
            CHECKPOINT_PARALLEL_DIMS: {CHECKPOINT_PP_DEGREE: spec.pp, CHECKPOINT_TP_DEGREE: spec.tp},
            "ds_config": ds_config, "ds_version": version, **client_state}


def _zero3_optimizer_state(spec, recipe, filler: Filler, ds_config: dict, step: int) -> dict:
    """DeepSpeedZeroOptimizer_Stage3.state_dict: per sub-group of the rank's partitions, Adam's state and the flat
    fp32 master partition."""
    version, LossScaler, ZeroStageEnum, _ = _ds_objects()
    groups = rules.zero3_sub_groups([math.prod(shape) for _, shape in recipe.params], spec.dp)
    state, flats = {}, []
    for i, (first, last, numel) in enumerate(groups):
        state[i] = {"step": torch.tensor(float(step)),
                    "exp_avg": filler.fill(torch.empty(numel, dtype=torch.float32)),
                    "exp_avg_sq": filler.fill(torch.empty(numel, dtype=torch.float32))}
        # the flat fp32 partition is the optimizer's parameter: it requires grad and carries the ds_ids of its
        # first and last model parameter (stage3.py), which torch.save pickles with it
        flat = filler.fill(torch.empty(numel, dtype=torch.float32)).requires_grad_()
        flat.ds_id = f"{first}_{last}"
        flats.append(flat)
    param_groups = _adam_param_groups(spec, ds_config)
    param_groups[0]["params"] = list(range(len(groups)))
    optimizer_state = {
        "zero_stage": ZeroStageEnum.weights, "loss_scaler": LossScaler(scale=1.0), "dynamic_loss_scale": False,
        "overflow": False, "partition_count": spec.dp,
        "optimizer_state_dict": {"state": state, "param_groups": param_groups}, "fp32_flat_groups": flats}
    return {"optimizer_state_dict": optimizer_state, "ds_config": ds_config, "ds_version": version}


def _optimizer_state(spec, recipe, filler: Filler, ds_config: dict, step: int) -> dict:
    if spec.zero == 3:
        return _zero3_optimizer_state(spec, recipe, filler, ds_config, step)
    version, LossScaler, ZeroStageEnum, fragment_address = _ds_objects()
    part = rules.zero1_partition_numel(recipe.numel, spec.dp)
    d = recipe.dp_rank
    padding = min(max(0, (d + 1) * part - recipe.numel), part)
    master, exp_avg, exp_avg_sq = (filler.fill(torch.empty(part, dtype=torch.float32)) for _ in range(3))
    mappings, offset = collections.OrderedDict(), 0
    lo, hi = d * part, (d + 1) * part
    for name, shape in recipe.params:
        n = math.prod(shape)
        start, end = max(offset, lo), min(offset + n, hi)
        if start < end:
            mappings[name] = fragment_address(start=start - lo, numel=end - start)
        offset += n
    groups = _adam_param_groups(spec, ds_config)
    optimizer_state = {
        "loss_scaler": LossScaler(scale=1.0), "dynamic_loss_scale": False, "overflow": False,
        "clip_grad": float(ds_config.get("gradient_clipping", 0.0)),
        "base_optimizer_state": {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": exp_avg,
                                               "exp_avg_sq": exp_avg_sq}}, "param_groups": groups},
        "single_partition_of_fp32_groups": [master[: part - padding]], "zero_stage": ZeroStageEnum(spec.zero),
        "group_paddings": [padding], "param_alignment_paddings": [[0] * len(recipe.params)],
        "partition_count": [spec.dp], "ds_version": version, "param_slice_mappings": [mappings]}
    return {"optimizer_state_dict": optimizer_state, "ds_config": ds_config, "ds_version": version}


def build_state(spec, recipe: checkpoint.FileRecipe, filler: Filler, ds_config: dict, client_state: dict) -> object:
    """The state dict DeepSpeed would hand its checkpoint engine for this file."""
    if recipe.kind == "layer_states":
        return collections.OrderedDict((name, filler.fill(torch.empty(shape, dtype=DTYPES[spec.precision])))
                                       for name, shape in recipe.params)
    if recipe.kind == "model_states":
        return _model_state(spec, recipe, filler, ds_config, client_state)
    return _optimizer_state(spec, recipe, filler, ds_config, client_state["harness_step"])


def tensors_of(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """key path -> tensor, for every tensor in a (nested) state dict."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    out: dict[str, torch.Tensor] = {}
    for k, v in items:
        out.update(tensors_of(v, f"{prefix}/{k}" if prefix else str(k)))
    return out
