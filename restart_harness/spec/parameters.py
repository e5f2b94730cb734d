"""The model's parameters, pipeline layer by pipeline layer, as one TP rank holds them: names, local shapes, splits. The
worker builds from this table and the planner sizes files from it (no torch here: the planner must be fast)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from restart_harness.spec.model_shape import ModelShape

# Pipeline layer kinds, in PipelineModule order: embedding, num_hidden_layers decoder layers, final norm, head.
EMBEDDING, DECODER, FINAL_NORM, LM_HEAD = "embedding", "decoder", "final_norm", "lm_head"


@dataclass(frozen=True)
class Param:
    """One parameter of one pipeline layer on one TP rank."""

    name: str  # relative to the pipeline layer module, e.g. "self_attn.q_proj.weight"
    shape: tuple[int, ...]  # this TP rank's shard
    split: str  # column (dim 0) | row (dim 1) | vocab (dim 0, embedding rows) | replicated
    fan_in: int  # input features of the whole (unsplit) weight: sets the init scale

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _column(name: str, in_features: int, out_features: int, tp: int) -> Param:
    return Param(name, (out_features // tp, in_features), "column", in_features)


def _row(name: str, in_features: int, out_features: int, tp: int) -> Param:
    return Param(name, (out_features, in_features // tp), "row", in_features)


def _norm(name: str, size: int) -> Param:
    return Param(name, (size,), "replicated", size)


def pipeline_layers(shape: ModelShape) -> list[str]:
    """Kind of each pipeline layer, index = the LL in layer_LL-model_TT-model_states.pt."""
    return [EMBEDDING] + [DECODER] * shape.num_hidden_layers + [FINAL_NORM, LM_HEAD]


def layer_params(shape: ModelShape, tp: int, kind: str) -> list[Param]:
    """Parameters of one pipeline layer of `kind` on a TP rank, in module registration order."""
    h, f, v = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    q, kv = shape.num_attention_heads * shape.dim_per_head, shape.num_key_value_heads * shape.dim_per_head
    if kind == EMBEDDING:
        return [Param("embed_tokens.weight", (v // tp, h), "vocab", h)]
    if kind == DECODER:
        return [
            _norm("input_layernorm.weight", h), _column("self_attn.q_proj.weight", h, q, tp),
            _column("self_attn.k_proj.weight", h, kv, tp), _column("self_attn.v_proj.weight", h, kv, tp),
            _row("self_attn.o_proj.weight", q, h, tp), _norm("post_attention_layernorm.weight", h),
            _column("mlp.gate_proj.weight", h, f, tp), _column("mlp.up_proj.weight", h, f, tp),
            _row("mlp.down_proj.weight", f, h, tp)]
    if kind == FINAL_NORM:
        return [_norm("norm.weight", h)]
    if kind == LM_HEAD:
        return [_column("lm_head.weight", h, v, tp)]
    raise ValueError(f"unknown pipeline layer kind {kind!r}")


def by_name(params: list[Param], prefix: str = "") -> dict[str, Param]:
    """name -> Param for the names under `prefix` (prefix removed): what one sub-module builds from."""
    return {p.name[len(prefix):]: p for p in params if p.name.startswith(prefix)}


def universal_checkpoint_patterns(shape: ModelShape) -> dict:
    """What DeepSpeed's ds_to_universal needs to know about the split of each parameter (client state
    `universal_checkpoint_info`, saved in every checkpoint so that any run can be resharded later), from this table:
    row-parallel weights are concatenated on dim 1, replicated ones (the norms) must be equal on every TP rank,
    vocabulary-parallel ones carry the unpadded vocabulary size; the rest (column-parallel) concatenate on dim 0.
    Names are matched (re.match) against `<pipeline layer index>.<name>`."""
    by_split: dict[str, set[str]] = {}
    for kind in (EMBEDDING, DECODER, FINAL_NORM, LM_HEAD):
        for p in layer_params(shape, 1, kind):
            by_split.setdefault(p.split, set()).add(p.name)

    def patterns(split: str) -> list[str]:
        return [rf"^\d+\.{re.escape(name)}$" for name in sorted(by_split.get(split, ()))]

    return {
        "tp_replicated_parameter_patterns": patterns("replicated"),
        "parameter_with_row_parallelism_patterns": patterns("row"),
        "vocabulary_parameter_patterns": patterns("vocab"),
        "original_vocab_size": shape.vocab_size}
