"""emulate=true: a rank writes, through the chosen engine's own save, exactly the files of one checkpoint of the
planned model and layout (names, writing ranks, tensor names, shapes, dtypes and storages, DeepSpeed's non-tensor
objects), without a model and without training; its restart reads its restart read set through the engine's own
load, in the order DeepSpeed's load_checkpoint does, and verifies every tensor against the digests taken at save.

Each file's state dict is rebuilt as DeepSpeed 0.19.8 assembles it (engine._save_checkpoint, _save_zero_checkpoint,
PipelineModule.save_state_dict, DeepSpeedZeroOptimizer.state_dict for ZeRO-1 with torch's AdamW) from the
planner's recipe (plan/checkpoint.py); tests/test_emulate.py compares them with a real run's files key by key.
Tensor bytes are random and unique per 4 KiB block (neither compressible nor deduplicable): a random pool copied at
a per-file offset, each 4 KiB block stamped with a counter of (rank, file, block).

Memory: a rank builds, saves and frees one file at a time, and the ranks of a node work in waves so that at most
`emulate_memory_gib` of file state is held at once on the node (every rank computes the same waves from the plan).
"""

from __future__ import annotations

import collections
import json
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from restart_harness.plan import checkpoint, rules
from restart_harness.results.schema import LOAD_CATEGORIES, SAVE_CATEGORIES
from restart_harness.storage.atomic import files_under, fsync_paths, write_json_atomic, write_text_atomic
from restart_harness.worker import checkpointing, digest
from restart_harness.worker.anatomy import Anatomy

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
POOL_BYTES = 64 << 20
BLOCK_BYTES = 4096


class Filler:
    """Incompressible, deduplication-proof tensor bytes, cheap to make: a random pool copied at a per-file
    offset, with each 4 KiB block's first 8 bytes replaced by a counter unique to (rank, file, block)."""

    def __init__(self, rank: int, seed: int):
        g = torch.Generator().manual_seed(seed * 7919 + rank)
        self.pool = torch.randint(0, 256, (POOL_BYTES,), dtype=torch.uint8, generator=g)
        self.rank = rank
        self.files = 0

    def fill(self, t: torch.Tensor) -> torch.Tensor:
        raw = t.view(-1).view(torch.uint8)
        n = raw.numel()
        offset = (self.files * 1_000_003) % POOL_BYTES
        done = 0
        while done < n:
            chunk = min(n - done, POOL_BYTES - offset)
            raw[done:done + chunk].copy_(self.pool[offset:offset + chunk])
            done += chunk
            offset = 0
        blocks = n // BLOCK_BYTES
        if blocks:
            stamps = raw[: blocks * BLOCK_BYTES].view(blocks, BLOCK_BYTES)[:, :8]
            counter = torch.arange(blocks, dtype=torch.int64) + ((self.rank << 48) | (self.files << 32))
            stamps.copy_(counter.view(torch.uint8).view(blocks, 8))
        self.files += 1
        return t


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
    """ZeRO's padded flat bf16/fp32 buffer of a shard and the module's parameters as views into it."""
    flat = filler.fill(torch.empty(rules.zero1_flat_numel(recipe.numel, spec.dp), dtype=DTYPES[spec.precision]))
    module, offset = collections.OrderedDict(), 0
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
    state = {"module": module, "buffer_names": [], "optimizer": None, "param_shapes": [shapes],
             "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None, "lr_scheduler": None,
             "data_sampler": None, "random_ltd": None, "skipped_steps": 0, "global_steps": step,
             "global_samples": step * spec.global_batch, "dp_world_size": spec.dp,
             "mp_world_size": spec.tp * spec.pp,
             CHECKPOINT_PARALLEL_DIMS: {CHECKPOINT_PP_DEGREE: spec.pp, CHECKPOINT_TP_DEGREE: spec.tp},
             "ds_config": ds_config, "ds_version": version}
    state.update(client_state)
    return state


def _layer_state(spec, recipe, filler: Filler) -> collections.OrderedDict:
    dtype = DTYPES[spec.precision]
    return collections.OrderedDict((name, filler.fill(torch.empty(shape, dtype=dtype))) for name, shape in recipe.params)


def _optimizer_state(spec, recipe, filler: Filler, ds_config: dict, step: int) -> dict:
    version, LossScaler, ZeroStageEnum, fragment_address = _ds_objects()
    part = rules.zero1_partition_numel(recipe.numel, spec.dp)
    d = recipe.dp_rank
    padding = max(0, (d + 1) * part - recipe.numel) if (d + 1) * part > recipe.numel else 0
    padding = min(padding, part)

    def partition() -> torch.Tensor:
        return filler.fill(torch.empty(part, dtype=torch.float32))

    master, exp_avg, exp_avg_sq = partition(), partition(), partition()
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
        "loss_scaler": LossScaler(scale=1.0),
        "dynamic_loss_scale": False,
        "overflow": False,
        "clip_grad": float(ds_config.get("gradient_clipping", 0.0)),
        "base_optimizer_state": {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": exp_avg,
                                               "exp_avg_sq": exp_avg_sq}}, "param_groups": groups},
        "single_partition_of_fp32_groups": [master[: part - padding]],
        "zero_stage": ZeroStageEnum.optimizer_states,
        "group_paddings": [padding],
        "param_alignment_paddings": [[0] * len(recipe.params)],
        "partition_count": [spec.dp],
        "ds_version": version,
        "param_slice_mappings": [mappings],
    }
    return {"optimizer_state_dict": optimizer_state, "ds_config": ds_config, "ds_version": version}


def build_state(spec, recipe: checkpoint.FileRecipe, filler: Filler, ds_config: dict, client_state: dict) -> object:
    """The state dict DeepSpeed would hand its checkpoint engine for this file."""
    if recipe.kind == "layer_states":
        return _layer_state(spec, recipe, filler)
    if recipe.kind == "model_states":
        return _model_state(spec, recipe, filler, ds_config, client_state)
    return _optimizer_state(spec, recipe, filler, ds_config, client_state["harness_step"])


def tensors_of(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """key path -> tensor, for every tensor in a (nested) state dict."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    out: dict[str, torch.Tensor] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(tensors_of(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(tensors_of(v, f"{prefix}/{i}" if prefix else str(i)))
    return out


# ---- the waves that bound memory --------------------------------------------------------------------------------
def waves(spec, recipes: list[checkpoint.FileRecipe]) -> tuple[int, int]:
    """(ranks of a node working at once, number of waves): at most emulate_memory_gib of file state per node."""
    largest = checkpoint.emulated_file_state_bytes(spec)
    budget = int(spec.emulate_memory_gib * 2**30)
    at_once = max(1, min(spec.ranks_per_node, budget // max(largest, 1)))
    return at_once, math.ceil(spec.ranks_per_node / at_once)


def _in_waves(spec, recipes, rank: int, work, anatomy: Anatomy) -> int:
    """Run work() in this rank's wave; every rank takes part in every wave's barrier. Returns the wave count."""
    at_once, count = waves(spec, recipes)
    mine = (rank % spec.ranks_per_node) // at_once
    for wave in range(count):
        if wave == mine:
            work()
        if count > 1:
            with anatomy.region("wave"):
                dist.barrier()
    return count


# ---- the two phases ---------------------------------------------------------------------------------------------
def save(args, spec, ds_config: dict, engine, plugin, anatomy: Anatomy, rank: int, log) -> None:
    step = spec.iters
    tag = f"global_step{step}"
    tag_dir = args.ckpt_root / tag
    if rank == 0:
        tag_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    recipes = checkpoint.recipes(spec)
    mine = [r for r in recipes if r.writer == rank]
    filler = Filler(rank, spec.seed)
    client_state = checkpointing.client_state(spec, step)
    written: list[tuple[str, float]] = []
    digests: dict[str, dict[str, str]] = {}
    timing = {"save": 0.0, "durable": 0.0, "start": time.time()}

    def work() -> None:
        timing["start"] = time.time()  # this rank's wave begins
        for recipe in mine:
            with anatomy.region("generate"):
                state = build_state(spec, recipe, filler, ds_config, client_state)
                digests[recipe.path] = {k: digest.tensor_digest(t) for k, t in tensors_of(state).items()}
            path = str(tag_dir / recipe.path)
            start = time.perf_counter()
            with anatomy.region("serialize", io=("write", "sync")):
                engine.save(state, path)
            saved = time.perf_counter()
            with anatomy.region("fsync"):
                plugin.wait_durable(engine)
                fsync_paths(files_under(Path(path)))
            timing["save"] += saved - start
            timing["durable"] += time.perf_counter() - start
            written.append((path, saved - start))
            del state

    began = time.perf_counter()  # every rank, before the first wave: commit_seconds spans all the waves
    with anatomy.measure(SAVE_CATEGORIES, excluded=("generate", "wave")) as window:
        count = _in_waves(spec, recipes, rank, work, anatomy)
        with anatomy.region("wait"):
            dist.barrier()
        if rank == 0:
            write_text_atomic(args.ckpt_root / "latest", tag)
        with anatomy.region("wait"):
            dist.barrier()
        committed = time.perf_counter() - began
        record = window.close()
    digest_path = args.run_dir / "digests" / tag / f"emulated-rank-{rank:05d}.json"
    digest_path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(digest_path, {"tag": tag, "rank": rank, "files": digests})
    files = [{"path": str(Path(p).relative_to(tag_dir)),
              "bytes": sum(f.stat().st_size for f in files_under(Path(p))), "seconds": s} for p, s in written]
    log.emit("save", tag=tag, step=step, start=timing["start"], blocking_seconds=timing["save"],
             durable_seconds=timing["durable"], commit_seconds=committed, files=files,
             bytes=sum(f["bytes"] for f in files), anatomy=record, emulated=True, waves=count,
             **{"async": plugin.is_async()}, in_flight_steps=0)


def restart(args, spec, engine, anatomy: Anatomy, rank: int, log) -> None:
    """Read this rank's restart read set through the engine, one file at a time, in DeepSpeed's order (and in the
    save's memory waves), verifying every tensor against the digest its writer recorded."""
    tag = (args.ckpt_root / "latest").read_text().strip()
    tag_dir = args.ckpt_root / tag
    saved: dict[str, dict[str, str]] = {}
    for path in sorted((args.run_dir / "digests" / tag).glob("emulated-rank-*.json")):
        saved.update(json.loads(path.read_text())["files"])
    sequence = checkpoint.restart_read_sequence(spec)[rank]
    loaded: list[dict] = []
    differing: list[str] = []
    counts = {"checked": 0, "verify_seconds": 0.0}

    def work() -> None:
        for name in sequence:
            start = time.perf_counter()
            with anatomy.region("deserialize", io=("read",)):
                state = engine.load(str(tag_dir / name), map_location="cpu")
            loaded.append({"path": str(tag_dir / name), "seconds": time.perf_counter() - start})
            with anatomy.region("verify"):
                v0 = time.perf_counter()
                for key, t in tensors_of(state).items():
                    counts["checked"] += 1
                    if saved.get(name, {}).get(key) != digest.tensor_digest(t):
                        differing.append(f"{name}:{key}")
                counts["verify_seconds"] += time.perf_counter() - v0
            del state

    with anatomy.measure(LOAD_CATEGORIES, excluded=("verify", "wave")) as window:
        count = _in_waves(spec, checkpoint.recipes(spec), rank, work, anatomy)
        record = window.close()
    log.mark("checkpoint_loaded")
    log.emit("loaded", tag=tag, files=loaded, waves=count)
    log.emit("load_anatomy", **record)
    log.emit("verify", tag=tag, ok=not differing and counts["checked"] > 0, differing=differing[:50],
             differing_count=len(differing), tensors=counts["checked"], seconds=counts["verify_seconds"])


def run(args, log, rank: int, spec, ds_config: dict, plugin, init_distributed) -> None:
    """One rank of an emulated phase: marks process_start .. dist_init_done, engine_initialized (the checkpoint
    engine constructed), then the save or the restart's load (no model build, no training)."""
    device = init_distributed(spec)
    log.mark("dist_init_done")
    anatomy = Anatomy(device.type, enabled=spec.anatomy)
    anatomy.add_prefix(args.ckpt_root)
    engine = plugin.emulation_engine()
    tp_rank, dp_rank, pp_rank = rank % spec.tp, (rank // spec.tp) % spec.dp, rank // (spec.tp * spec.dp)
    log.emit("layout", dp_rank=dp_rank, tp_rank=tp_rank, pp_rank=pp_rank, device=str(device), local_parameters=0,
             emulated=True)
    log.mark("engine_initialized")
    if args.phase == "checkpoint":
        save(args, spec, ds_config, engine, plugin, anatomy, rank, log)
    else:
        restart(args, spec, engine, anatomy, rank, log)
    dist.barrier()
    log.mark("finished")
