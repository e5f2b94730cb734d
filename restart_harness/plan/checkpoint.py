"""RunSpec -> every file of one checkpoint (path, bytes, writing rank, kind) and what each rank reads back at a
restart, from the parameter table the worker builds its model from (restart_harness/spec/parameters.py) and
DeepSpeed's placement rules (restart_harness/plan/rules.py); each file's bytes: its storages exactly, torch.save's
pickle and zip estimated (docs/planner.md). No torch, no DeepSpeed import."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from restart_harness.plan import rules
from restart_harness.spec import parameters as table
from restart_harness.spec.runspec import RunSpec


class StoredFiles(Protocol):
    """What the planner asks of an engine (engines/base.py FileLayout, an engine's files()): the files it stores for
    each of DeepSpeed's, and how much of each a restarting rank reads."""

    def stored(self, recipe, rank_of) -> list[tuple[str, int]]: ...

    def restart_read_bytes(self, path: str, nbytes: int, dp_rank: int) -> int: ...


# Names of the entries torch.save writes besides the storages (data/0, data/1, ...), under "<file stem>/".
_META_ENTRIES = ("data.pkl", ".format_version", ".storage_alignment", "byteorder", "version", ".data/serialization_id")
_ENTRY_FIXED_BYTES = 30 + 46 + 62  # local header + central directory record + mean alignment padding
_END_RECORD_BYTES = 22

# Pickle bytes: base per file kind, and per name (added to the name's length). Calibrated on tiny runs
# (tests/test_planner.py checks the whole estimate against real files of three layouts); ZeRO-3's model files (a
# placeholder, its own empty storage and its shape per parameter) on tiny and llama3-8B shrink=64, 4 and 32 layers
# (tests/test_mlperf.py checks the latter's files).
PICKLE_BASE = {"layer_states": 100, "model_states_pipe": 800, "model_states": 6700, "optimizer_states": 1450,
               "model_states_zero3": 1020, "optimizer_states_zero3": 1500}
PICKLE_PER_NAME = {"layer_states": 62, "model_states_pipe": 30, "model_states": 40, "optimizer_states": 40,
                   "model_states_zero3": 186, "optimizer_states_zero3": 0}


@dataclass(frozen=True)
class SavedFile:
    """What goes into one torch.save call: storage sizes (exact) and the names the pickle will hold."""

    stem: str  # file name without ".pt": torch uses it as the archive's top folder
    storage_bytes: tuple[int, ...]
    pickle_kind: str  # key of PICKLE_BASE
    names: tuple[str, ...] = ()

    @property
    def tensor_bytes(self) -> int:
        return sum(self.storage_bytes)

    def zip_bytes(self) -> int:
        entries = list(_META_ENTRIES) + [f"data/{i}" for i in range(len(self.storage_bytes))]
        return _END_RECORD_BYTES + sum(_ENTRY_FIXED_BYTES + 2 * len(f"{self.stem}/{e}") for e in entries)

    def pickle_bytes(self) -> int:
        per = PICKLE_PER_NAME[self.pickle_kind]
        return PICKLE_BASE[self.pickle_kind] + sum(len(n) + per for n in self.names)

    def bytes(self) -> int:
        """Predicted file size: exact storages + estimated pickle and zip structure."""
        return self.tensor_bytes + self.pickle_bytes() + self.zip_bytes()


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


def shards(spec: RunSpec) -> list[RankShard]:
    """Each (stage, TP rank)'s layers and parameter names: '<index>.<name>' at every pp (PipelineModule's naming; the
    pp=1 model names its layers the same way, model/llama.py)."""
    kinds = table.pipeline_layers(spec.shape)
    out = []
    for stage, layers in enumerate(stage_layers(spec)):
        for t in range(spec.tp):
            shard = RankShard(stage, t, layers)
            for i in layers:
                for p in table.layer_params(spec.shape, spec.tp, kinds[i]):
                    shard.names.append(f"{i}.{p.name}")
                    shard.numel += p.numel
            out.append(shard)
    return out


@dataclass(frozen=True)
class FileRecipe:
    """What one checkpoint file holds, as DeepSpeed 0.19.8 writes it: enough to rebuild its state dict (emulation,
    stacks/_deepspeed_files.py) and to size it (the planner)."""

    path: str  # relative to the tag directory
    kind: str  # layer_states | model_states | optimizer_states
    writer: int  # global rank whose engine.save() writes it
    stage: int
    tp_rank: int
    dp_rank: int | None  # optimizer files: the ZeRO partition
    layer: int | None  # layer files: the pipeline layer index
    params: tuple[tuple[str, tuple[int, ...]], ...]  # (name, local shape) in the module's registration order
    pipe: bool  # pp > 1: PipelineModule (layer files, model files without a module)

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for _, shape in self.params)


def recipes(spec: RunSpec) -> list[FileRecipe]:
    """Every file of the checkpoint's tag directory, in the order DeepSpeed's ranks write them."""
    kinds = table.pipeline_layers(spec.shape)
    prefix = "bf16_" if spec.precision == "bf16" else ""
    dp, tp, pipe = spec.dp, spec.tp, spec.pp > 1
    out = []
    for shard in shards(spec):
        s, t = shard.stage, shard.tp_rank
        writer = rules.global_rank(s, 0, t, dp, tp)
        mp_rank = s * tp + t  # DeepSpeed's checkpoint_mp_rank: pipeline stage x TP degree + TP rank
        named = []
        for i in shard.layers:
            layer = tuple((p.name, p.shape) for p in table.layer_params(spec.shape, tp, kinds[i]))
            named += [(f"{i}.{n}", shp) for n, shp in layer]
            if pipe:
                out.append(FileRecipe(f"layer_{i:02d}-model_{t:02d}-model_states.pt", "layer_states", writer, s, t,
                                      None, i, layer, pipe))
        if spec.zero == 3:  # every data-parallel rank saves the module with its parameters partitioned away
            out += [FileRecipe(zero3_model_file(d, mp_rank), "model_states", rules.global_rank(s, d, t, dp, tp), s, t,
                               d, None, tuple(named), pipe) for d in range(dp)]
        else:
            out.append(FileRecipe(f"mp_rank_{mp_rank:02d}_model_states.pt", "model_states", writer, s, t, None, None,
                                  tuple(named), pipe))
        for d in range(dp):
            out.append(FileRecipe(f"{prefix}zero_pp_rank_{d}_mp_rank_{mp_rank:02d}_optim_states.pt",
                                  "optimizer_states", rules.global_rank(s, d, t, dp, tp), s, t, d, None,
                                  tuple(named), pipe))
    return out


def zero3_model_file(dp_rank: int, mp_rank: int) -> str:
    return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_model_states.pt"


def _saved_file(spec: RunSpec, r: FileRecipe) -> SavedFile:
    """What torch.save gets for a recipe: its tensor storages (exact) and the names its pickle holds."""
    elem = ELEMENT_BYTES[spec.precision]
    stem, names = r.path.removesuffix(".pt"), tuple(n for n, _ in r.params)
    if spec.zero == 3:
        if r.kind == "model_states":  # each parameter an empty placeholder (its data lives in the partitions)
            return SavedFile(stem, (0,) * len(r.params), "model_states_zero3", names)
        groups = rules.zero3_partition_groups([math.prod(shape) for _, shape in r.params], spec.dp)
        return SavedFile(stem, tuple(b for n in groups for b in (4 * n,) * OPTIMIZER_STATES + (ADAM_STEP_BYTES,)),
                         "optimizer_states_zero3")
    if r.kind == "layer_states":
        # Each layer's state dict is cloned before saving: one storage per tensor.
        return SavedFile(stem, tuple(elem * math.prod(shp) for _, shp in r.params), "layer_states", names)
    if r.kind == "model_states":
        if r.pipe:
            return SavedFile(stem, (), "model_states_pipe", names)
        # The module's weights are views into ZeRO's padded flat buffer and are saved uncloned: one storage.
        return SavedFile(stem, (elem * rules.zero1_flat_numel(r.numel, spec.dp),), "model_states", names)
    partition = 4 * rules.zero1_partition_numel(r.numel, spec.dp)
    return SavedFile(stem, (partition,) * OPTIMIZER_STATES + (ADAM_STEP_BYTES,), "optimizer_states", names)


# An emulated rank holds one file's tensors and, at worst, as much again while the engine stages or serializes them.
EMULATED_STATE_FACTOR = 2
# A streaming one (stacks/_streamed.py, for an engine that saves with torch.save) holds its random pool (64 MiB) and
# one chunk buffer whatever the file's size (its peak above the process's own: tests/test_emulate.py); it streams
# only where that is less than holding the largest file.
STREAM_CHUNK_BYTES = 64 << 20
EMULATED_STREAM_BYTES = 256 << 20


def emulated_file_state_bytes(spec: RunSpec, streamable: bool = False) -> int:
    """Memory an emulated rank needs for the largest file of the checkpoint (emulate=true); `streamable`: the engine
    saves with torch.save, so the files can be streamed."""
    held = max((_saved_file(spec, r).tensor_bytes for r in recipes(spec)), default=0) * EMULATED_STATE_FACTOR
    return min(held, EMULATED_STREAM_BYTES) if streamable else held


def emulation_streams(spec: RunSpec, streamable: bool) -> bool:
    """Does an emulated rank stream its files (stacks/_streamed.py) rather than hold each in memory?"""
    return streamable and emulated_file_state_bytes(spec) > EMULATED_STREAM_BYTES


def waves(spec: RunSpec, streamable: bool) -> tuple[int, int]:
    """(ranks of a node working at once, number of waves) of an emulated save or load: at most emulate_memory_gib of
    file state per node (docs/emulation.md)."""
    largest = emulated_file_state_bytes(spec, streamable)
    at_once = max(1, min(spec.ranks_per_node, int(spec.emulate_memory_gib * 2**30) // max(largest, 1)))
    return at_once, math.ceil(spec.ranks_per_node / at_once)


def wave_of(rank: int, ranks_per_node: int, at_once: int) -> int:
    """The wave a rank saves and loads in: a node's ranks in order, at_once of them a wave."""
    return (rank % ranks_per_node) // at_once


def files(spec: RunSpec) -> list[PlannedFile]:
    """Every file DeepSpeed's TorchCheckpointEngine writes into the tag directory, sorted by path."""
    saved = [(r, _saved_file(spec, r)) for r in recipes(spec)]
    return sorted((PlannedFile(r.path, s.bytes(), r.kind, r.writer, s.tensor_bytes) for r, s in saved),
                  key=lambda f: f.path)


def stored_files(spec: RunSpec, layout: StoredFiles) -> list[PlannedFile]:
    """files() as the run's engine stores them (layout: the engine's StoredFiles, Engine.files(): its names,
    replicas and writing ranks), sorted."""
    saved = [(r, _saved_file(spec, r)) for r in recipes(spec)]
    return sorted((PlannedFile(path, s.bytes(), r.kind, rank, s.tensor_bytes)
                   for r, s in saved for path, rank in layout.stored(r, _rank_at(spec, r))), key=lambda f: f.path)


def rank_saves(spec: RunSpec, layout: StoredFiles) -> dict[int, tuple[int, int]]:
    """rank -> (bytes, tensors) it saves per checkpoint, the files as the run's engine stores them: what an engine
    that holds a rank's whole save in memory before writing it must have room for (engine=datastates' host cache).
    `tensors` bounds the state's tensors (one per parameter of a module file, one per storage of an optimizer file)."""
    out: dict[int, tuple[int, int]] = {}
    for r in recipes(spec):
        saved = _saved_file(spec, r)
        for _, rank in layout.stored(r, _rank_at(spec, r)):
            nbytes, tensors = out.get(rank, (0, 0))
            out[rank] = (nbytes + saved.bytes(), tensors + len(r.params) + len(saved.storage_bytes))
    return out


def stored_reads(spec: RunSpec, layout: StoredFiles) -> dict[int, list[str]]:
    """restart_reads() as the run's engine stores the files: a load reads the first file stored for each."""
    first = {r.path: layout.stored(r, _rank_at(spec, r))[0][0] for r in recipes(spec)}
    return {rank: [first[p] for p in paths] for rank, paths in restart_reads(spec).items()}


def stored_read_bytes(spec: RunSpec, layout: StoredFiles, reads: dict[int, list[str]],
                      size_of: dict[str, int]) -> dict[int, int]:
    """rank -> the bytes its restart reads from storage of the stored files it loads (reads: stored_reads): all of
    each, less where the engine has one replica read for the group (StoredFiles.restart_read_bytes)."""
    return {r: sum(layout.restart_read_bytes(p, size_of[p], (r // spec.tp) % spec.dp) for p in paths)
            for r, paths in reads.items()}


def _rank_at(spec: RunSpec, r: FileRecipe):
    return lambda d: rules.global_rank(r.stage, d, r.tp_rank, spec.dp, spec.tp)


def restart_read_sequence(spec: RunSpec) -> dict[int, list[str]]:
    """global rank -> the files its load_checkpoint reads in full, in order and with repeats (DeepSpeed 0.19.8,
    default engine): one engine.load() each (docs/planner.md, restart reads)."""
    prefix = "bf16_" if spec.precision == "bf16" else ""
    out = {}
    for shard in shards(spec):
        s, t = shard.stage, shard.tp_rank
        mp_rank = s * spec.tp + t
        for d in range(spec.dp):
            if spec.zero == 3:
                names = [zero3_model_file(d, 0), zero3_model_file(d, mp_rank)]
            else:
                names = ["mp_rank_00_model_states.pt", f"mp_rank_{mp_rank:02d}_model_states.pt"]
            if spec.pp > 1:
                for i in shard.layers:
                    names += [f"layer_{i:02d}-model_00-model_states.pt", f"layer_{i:02d}-model_{t:02d}-model_states.pt"]
            names.append(f"{prefix}zero_pp_rank_{d}_mp_rank_{mp_rank:02d}_optim_states.pt")
            out[rules.global_rank(s, d, t, spec.dp, spec.tp)] = names
    return dict(sorted(out.items()))


def restart_reads(spec: RunSpec) -> dict[int, list[str]]:
    """global rank -> the distinct files its load_checkpoint reads in full (restart_read_sequence without repeats)."""
    return {rank: list(dict.fromkeys(names)) for rank, names in restart_read_sequence(spec).items()}
