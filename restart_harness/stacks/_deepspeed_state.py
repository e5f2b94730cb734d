"""The DeepSpeed stack's state (helpers of stacks/deepspeed.py), digested: state_digests() what one rank restores,
compared with its own digests taken at save; full_state_digests() every parameter's full, unsplit optimizer state
whatever the layout, against reference(): the same digested from the original checkpoint's files by code of our own
(digests/<tag>/full-state.json), after convert() ran DeepSpeed's ds_to_universal once per tag
(records/convert-<tag>.json) for a restart at another layout. docs/reshard.md."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from restart_harness import iocount
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import files_under, read_json, write_json_atomic
from restart_harness.model import digest
from restart_harness.plan import checkpoint, rules
from restart_harness.spec import parameters as table
from restart_harness.spec.runspec import RunSpec

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
MARKER = ".rh-converted.json"
CONVERTER = "deepspeed.checkpoint.ds_to_universal"
CAT_DIM = {"column": 0, "vocab": 0, "row": 1}


def split_of(shape, name: str) -> str:
    """column | row | vocab | replicated, from `<pipeline layer index>.<name within the layer>`."""
    index, _, local = name.partition(".")
    kind = table.pipeline_layers(shape)[int(index)]
    return next(p.split for p in table.layer_params(shape, 1, kind) if p.name == local)


def merge_tp(shards: list[torch.Tensor], split: str) -> torch.Tensor:
    """One parameter's full tensor from its TP shards (replicated: the first, which all must equal)."""
    return shards[0] if split == "replicated" or len(shards) == 1 else torch.cat(shards, dim=CAT_DIM[split])


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


def universal_tag(tag: str) -> str:
    return f"{tag}_universal"


def convert(run_dir: Path, ckpt_root: Path, tag: str, say=print) -> dict:
    """The universal checkpoint of tag (converting it now, or the earlier conversion's record)."""
    out = ckpt_root / universal_tag(tag)
    if (out / MARKER).is_file():
        return {**read_json(out / MARKER), "reused": True}
    if out.exists():  # an interrupted conversion: start over
        shutil.rmtree(out)
    workers = max(1, min(4, os.cpu_count() or 1))
    cmd = [sys.executable, "-m", CONVERTER, "--input_folder", str(ckpt_root / tag), "--output_folder", str(out),
           "--num_extract_workers", str(workers), "--num_merge_workers", str(workers)]
    log_path = run_dir / "logs" / f"convert-{tag}.log"
    log_path.parent.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fd, shared = tempfile.mkstemp(prefix=".rh-io-", dir=run_dir)
    os.close(fd)
    try:
        lib = iocount.build()
    except OSError:
        lib = None
    if lib is not None:
        env.update({"LD_PRELOAD": f"{lib} {env.get('LD_PRELOAD', '')}".strip(), iocount.ENV_PREFIXES: str(ckpt_root),
                    iocount.ENV_SHARED: shared})
    say(f"  [convert] {tag} -> {out.name} with {CONVERTER} ({workers} extract and merge workers; log {log_path})")
    start, wall = time.perf_counter(), time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    seconds = time.perf_counter() - start
    io = iocount.read_shared(Path(shared)) if lib is not None else None
    Path(shared).unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise RunFailed(f"converting {tag} to a universal checkpoint failed (exit {proc.returncode}): {tail[0]}; "
                        f"see {log_path}")
    written = files_under(out)
    record = {
        "tag": tag, "output": str(out), "converter": CONVERTER, "workers": workers, "start": wall,
        "seconds": round(seconds, 6),
        "files_written": len(written), "bytes_written": sum(p.stat().st_size for p in written),
        "bytes_read_counted": io["read"]["bytes"] if io else None,
        "bytes_written_counted": io["write"]["bytes"] if io else None,
        "read_calls": io["read"]["calls"] if io else None, "write_calls": io["write"]["calls"] if io else None,
        "input_bytes": sum(p.stat().st_size for p in files_under(ckpt_root / tag)),
        "input_files": len(files_under(ckpt_root / tag)),
        "log": str(log_path.relative_to(run_dir)), "reused": False}
    write_json_atomic(out / MARKER, record)
    (run_dir / "records").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "records" / f"convert-{tag}.json", record)
    say(f"  [convert] {record['files_written']} files, {record['bytes_written'] / 2**20:,.1f} MiB written in "
        f"{seconds:.2f} s")
    return record


def reference(run_dir: Path, ckpt_root: Path, tag: str, original: RunSpec) -> Path:
    """digests/<tag>/full-state.json: each parameter's full fp32 weights and Adam moments from the original files."""
    path = run_dir / "digests" / tag / "full-state.json"
    if path.is_file():
        return path
    shards: dict[str, list[dict[str, torch.Tensor]]] = {}  # name -> per TP rank {key: shard}
    step = None
    for recipe in checkpoint.recipes(original):
        if recipe.kind != "optimizer_states" or recipe.dp_rank != 0:
            continue  # one recipe per (stage, TP rank): the partitions of all DP ranks are read below
        flats: dict[str, list[torch.Tensor]] = {k: [] for k in KEYS}
        for d in range(original.dp):
            name = recipe.path.replace("zero_pp_rank_0_", f"zero_pp_rank_{d}_")
            osd = torch.load(ckpt_root / tag / name, map_location="cpu", weights_only=False)["optimizer_state_dict"]
            if original.zero == 3:  # per sub-group: Adam's state and the flat fp32 partition
                states = [osd["optimizer_state_dict"]["state"][i] for i in range(len(osd["fp32_flat_groups"]))]
                flats["fp32"].append(torch.cat(list(osd["fp32_flat_groups"])).detach())
            else:
                states = [osd["base_optimizer_state"]["state"][0]]
                flats["fp32"].append(osd["single_partition_of_fp32_groups"][0])
            flats["exp_avg"].append(torch.cat([st["exp_avg"] for st in states]))
            flats["exp_avg_sq"].append(torch.cat([st["exp_avg_sq"] for st in states]))
            step = float(states[0]["step"])
        offset = 0
        whole = {k: torch.cat(v) for k, v in flats.items()}
        for pname, shape in recipe.params:
            n = math.prod(shape)
            per_tp = shards.setdefault(pname, [{} for _ in range(original.tp)])
            if original.zero == 3:  # each parameter padded to a multiple of dp, one part on each rank
                part = rules.zero3_partition_numel(n, original.dp)
                per_tp[recipe.tp_rank] = {k: torch.cat([f[offset:offset + part] for f in flats[k]])[:n].view(shape)
                                          for k in KEYS}
                offset += part
            else:  # one flat group split in dp parts (the last partition's padding beyond numel)
                per_tp[recipe.tp_rank] = {k: whole[k][offset:offset + n].view(shape) for k in KEYS}
                offset += n
    parameters = {}
    for pname, per_tp in shards.items():
        split = split_of(original.shape, pname)
        parameters[pname] = {k: digest.tensor_digest(merge_tp([s[k] for s in per_tp], split)) for k in KEYS}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"tag": tag, "layout": original.layout, "adam_step": step, "parameters": parameters})
    return path
