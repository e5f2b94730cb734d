"""The universal checkpoint DeepSpeed's ds_to_universal makes of a checkpoint, and what each rank reads of it when a
restart loads it at another layout (DeepSpeed 0.19.8; the files and the reads: docs/reshard.md#planned). No torch."""

from __future__ import annotations

import math

from restart_harness.plan import checkpoint, rules
from restart_harness.spec import parameters as table
from restart_harness.spec.runspec import RunSpec

STATES = ("fp32", "exp_avg", "exp_avg_sq")
# Measured on converted files (tests/test_reshard.py checks the whole estimate): torch.save's pickle of
# {cat_dim, vocab_tensor, param} and what the zip writer adds beyond SavedFile's model.
PARAM_PICKLE_BYTES = 190
ZIP_PADDING_BYTES = 150
OPTIMIZER_STATE_BYTES = 2048
ZERO3_OPTIMIZER_STATE_LESS_BYTES = 800  # the ds_config and version the rank's optimizer file carries besides


def _file_bytes(stem: str, storage: int) -> int:
    saved = checkpoint.SavedFile(stem, (storage,), "layer_states")
    return storage + PARAM_PICKLE_BYTES + saved.zip_bytes() + ZIP_PADDING_BYTES


def full_params(spec: RunSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(name, full shape) of every parameter, in pipeline-layer order (names as every layout names them)."""
    return [(f"{i}.{p.name}", p.shape) for i, kind in enumerate(table.pipeline_layers(spec.shape))
            for p in table.layer_params(spec.shape, 1, kind)]


def files(spec: RunSpec) -> list[checkpoint.PlannedFile]:
    """The converted checkpoint's files (paths relative to <tag>_universal/); `rank` is -1: the converter writes
    them, no rank does."""
    out = []
    for name, shape in full_params(spec):
        storage = 4 * math.prod(shape)
        out += [checkpoint.PlannedFile(f"zero/{name}/{stem}.pt", _file_bytes(stem, storage), "universal", -1, storage)
                for stem in STATES]
        if spec.zero < 3:  # ZeRO-3's conversion keeps Adam's step in optimizer_state.pt only
            out.append(checkpoint.PlannedFile(f"zero/{name}/step.pt", _file_bytes("step", 4), "universal", -1, 4))
    if spec.zero < 3:
        out.append(checkpoint.PlannedFile("zero/optimizer_state.pt", OPTIMIZER_STATE_BYTES, "universal", -1, 0))
    else:  # ZeRO-3's conversion keeps the first rank's optimizer state whole (its moments and flat fp32 partition)
        first = min((f for f in checkpoint.files(spec) if f.kind == "optimizer_states"), key=lambda f: f.rank)
        out.append(checkpoint.PlannedFile("zero/optimizer_state.pt", first.bytes - ZERO3_OPTIMIZER_STATE_LESS_BYTES,
                                          "universal", -1, first.tensor_bytes))
    out += [checkpoint.PlannedFile(f.path, f.bytes, f.kind, -1, f.tensor_bytes)
            for f in checkpoint.files(spec) if f.kind == "model_states"]
    return sorted(out, key=lambda f: f.path)


def restart_read_sequence(saved: RunSpec, target: RunSpec) -> dict[int, list[str]]:
    """global rank of the target layout -> the converted files it reads in full, with repeats."""
    shards = checkpoint.shards(target)
    if saved.zero == 3:
        return _zero3_reads(shards, target)
    full = dict(full_params(target))
    models = sorted(f.path for f in checkpoint.files(saved) if f.kind == "model_states")
    out = {}
    for shard in shards:
        names = shard.names  # this (stage, TP rank)'s parameters in the engine's order, TP-local shapes
        sizes = [math.prod(s) // (target.tp if _split(target, n) != "replicated" else 1) for n, s in
                 ((n, full[n]) for n in names)]
        part = rules.zero1_partition_numel(shard.numel, target.dp)
        mp_rank = shard.stage * target.tp + shard.tp_rank
        mapped = models[mp_rank * len(models) // (target.tp * target.pp)]
        for d in range(target.dp):
            lo, hi, offset, mine = d * part, (d + 1) * part, 0, []
            for name, n in zip(names, sizes, strict=True):
                if max(offset, lo) < min(offset + n, hi):
                    mine += [f"zero/{name}/{stem}.pt" for stem in (*STATES, "step")]
                offset += n
            rank = rules.global_rank(shard.stage, d, shard.tp_rank, target.dp, target.tp)
            out[rank] = list(dict.fromkeys([models[0], mapped, "zero/optimizer_state.pt", *mine]))
    return dict(sorted(out.items()))


def _zero3_reads(shards, target: RunSpec) -> dict[int, list[str]]:
    """ZeRO-3 (pp=1): every rank holds a part of every parameter of its TP shard, so it reads all three files of
    each, after the first data-parallel rank's model file of its TP rank and optimizer_state.pt (traced:
    tests/test_reshard.py)."""
    out = {}
    for shard in shards:
        mine = [f"zero/{name}/{stem}.pt" for name in shard.names for stem in STATES]
        for d in range(target.dp):
            rank = rules.global_rank(shard.stage, d, shard.tp_rank, target.dp, target.tp)
            out[rank] = [checkpoint.zero3_model_file(0, shard.tp_rank), "zero/optimizer_state.pt", *mine]
    return dict(sorted(out.items()))


def _split(spec: RunSpec, name: str) -> str:
    index, _, local = name.partition(".")
    kind = table.pipeline_layers(spec.shape)[int(index)]
    return next(p.split for p in table.layer_params(spec.shape, 1, kind) if p.name == local)


def plan(saved: RunSpec, target: RunSpec) -> dict:
    """What the plan command prints for a restart at another layout."""
    fs = files(saved)
    size = {f.path: f.bytes for f in fs}
    reads = restart_read_sequence(saved, target)
    per_rank = {r: sum(size[p] for p in paths) for r, paths in reads.items()}
    return {
        "from": saved.layout, "to": target.layout,
        "files": [{"path": f.path, "bytes": f.bytes, "kind": f.kind, "tensor_bytes": f.tensor_bytes} for f in fs],
        "total_files": len(fs), "total_bytes": sum(f.bytes for f in fs),
        "restart_reads": {str(r): list(dict.fromkeys(p)) for r, p in reads.items()},
        "restart_read_bytes": sum(per_rank.values()),
        "restart_read_bytes_per_rank": {"max": max(per_rank.values()), "min": min(per_rank.values())}}
