"""RunSpec -> every file of one checkpoint (path, bytes, writing rank, kind) and what each rank reads back at a
restart, from the parameter table the worker builds its model from (restart_harness/spec/parameters.py) and
DeepSpeed's placement rules (restart_harness/plan/rules.py). No torch, no DeepSpeed import."""

from __future__ import annotations

from dataclasses import dataclass, field

from restart_harness.plan import rules
from restart_harness.plan.torch_save import SavedFile
from restart_harness.spec import parameters as table
from restart_harness.spec.runspec import RunSpec

ELEMENT_BYTES = {"bf16": 2, "fp32": 4}
# ZeRO-1 optimizer file: fp32 master partition, Adam exp_avg and exp_avg_sq (4 bytes each), and Adam's step.
OPTIMIZER_STATES = 3
ADAM_STEP_BYTES = 4


@dataclass
class RankShard:
    """What one (stage, TP rank) holds: its pipeline layers and the model-level parameter names."""

    stage: int
    tp_rank: int
    layers: list[int]  # pipeline layer indices (pp>1), or every layer (pp=1)
    names: list[str] = field(default_factory=list)  # parameter names as the engine's module names them
    numel: int = 0


@dataclass
class PlannedFile:
    path: str
    bytes: int
    kind: str  # layer_states | model_states | optimizer_states (inventory.KINDS)
    rank: int
    tensor_bytes: int  # the exact part of bytes (tensor storages); the rest is the estimated pickle + zip


def stage_layers(spec: RunSpec) -> list[list[int]]:
    """Pipeline layer indices of each stage, split the way PipelineModule(partition_method='type:DecoderLayer') does."""
    kinds = table.pipeline_layers(spec.shape)
    if spec.pp == 1:
        return [list(range(len(kinds)))]
    parts = rules.partition_balanced([1 if k == table.DECODER else 0 for k in kinds], spec.pp)
    return [list(range(parts[s], parts[s + 1])) for s in range(spec.pp)]


def _module_prefix(kind: str, index: int, pp: int) -> str:
    """How the engine's module names a pipeline layer's parameters (PipelineModule: '<index>.'; pp=1 attributes)."""
    if pp > 1:
        return f"{index}."
    return {table.EMBEDDING: "embed.", table.DECODER: f"layers.{index - 1}.", table.FINAL_NORM: "final.",
            table.LM_HEAD: "head."}[kind]


def shards(spec: RunSpec) -> list[RankShard]:
    kinds = table.pipeline_layers(spec.shape)
    out = []
    for stage, layers in enumerate(stage_layers(spec)):
        for t in range(spec.tp):
            shard = RankShard(stage, t, layers)
            for i in layers:
                prefix = _module_prefix(kinds[i], i, spec.pp)
                for p in table.layer_params(spec.shape, spec.tp, kinds[i]):
                    shard.names.append(prefix + p.name)
                    shard.numel += p.numel
            out.append(shard)
    return out


def _saved_files(spec: RunSpec) -> list[tuple[SavedFile, str, int]]:
    """(what torch.save gets, kind, writing global rank) for every file of the checkpoint's tag directory."""
    elem = ELEMENT_BYTES[spec.precision]
    kinds = table.pipeline_layers(spec.shape)
    prefix = "bf16_" if spec.precision == "bf16" else ""
    dp, tp = spec.dp, spec.tp
    out = []
    for shard in shards(spec):
        s, t = shard.stage, shard.tp_rank
        writer = rules.global_rank(s, 0, t, dp, tp)
        mp_rank = s * tp + t  # DeepSpeed's checkpoint_mp_rank: pipeline stage x TP degree + TP rank
        if spec.pp > 1:
            for i in shard.layers:
                params = table.layer_params(spec.shape, tp, kinds[i])
                stem = f"layer_{i:02d}-model_{t:02d}-model_states"
                # Each layer's state dict is cloned before saving: one storage per tensor.
                saved = SavedFile(stem, tuple(elem * p.numel for p in params), "layer_states",
                                  tuple(p.name for p in params))
                out.append((saved, "layer_states", writer))
            model = SavedFile(f"mp_rank_{mp_rank:02d}_model_states", (), "model_states_pipe", tuple(shard.names))
        else:
            # The module's weights are views into ZeRO's padded flat buffer and are saved uncloned: one storage.
            flat = elem * rules.zero1_flat_numel(shard.numel, dp)
            model = SavedFile(f"mp_rank_{mp_rank:02d}_model_states", (flat,), "model_states", tuple(shard.names))
        out.append((model, "model_states", writer))
        partition = 4 * rules.zero1_partition_numel(shard.numel, dp)
        for d in range(dp):
            optim = SavedFile(f"{prefix}zero_pp_rank_{d}_mp_rank_{mp_rank:02d}_optim_states",
                              (partition,) * OPTIMIZER_STATES + (ADAM_STEP_BYTES,), "optimizer_states",
                              tuple(shard.names))
            out.append((optim, "optimizer_states", rules.global_rank(s, d, t, dp, tp)))
    return out


def files(spec: RunSpec) -> list[PlannedFile]:
    """Every file DeepSpeed's TorchCheckpointEngine writes into the tag directory, sorted by path."""
    planned = [PlannedFile(f"{saved.stem}.pt", saved.bytes(), kind, rank, saved.tensor_bytes)
               for saved, kind, rank in _saved_files(spec)]
    return sorted(planned, key=lambda f: f.path)


def restart_reads(spec: RunSpec) -> dict[int, list[str]]:
    """global rank -> the distinct files its load_checkpoint reads in full (DeepSpeed 0.19.8, default engine).

    DeepSpeed's state-dict loader first torch.loads the first file of the sorted list of candidates (mp_rank_00,
    or a layer's model_00 file) to check the saved model-parallel size, then the rank's own file; ZeRO-1 (not
    elastic) reads only the rank's own optimizer file."""
    prefix = "bf16_" if spec.precision == "bf16" else ""
    out = {}
    for shard in shards(spec):
        s, t = shard.stage, shard.tp_rank
        mp_rank = s * spec.tp + t
        for d in range(spec.dp):
            names = ["mp_rank_00_model_states.pt", f"mp_rank_{mp_rank:02d}_model_states.pt"]
            if spec.pp > 1:
                for i in shard.layers:
                    names += [f"layer_{i:02d}-model_00-model_states.pt", f"layer_{i:02d}-model_{t:02d}-model_states.pt"]
            names.append(f"{prefix}zero_pp_rank_{d}_mp_rank_{mp_rank:02d}_optim_states.pt")
            out[rules.global_rank(s, d, t, spec.dp, spec.tp)] = list(dict.fromkeys(names))
    return dict(sorted(out.items()))
