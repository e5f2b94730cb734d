"""A restart of a DeepSpeed checkpoint at another layout, DeepSpeed's way (helpers of stacks/deepspeed.py): convert()
runs ds_to_universal once per tag (records/convert-<tag>.json), reference() digests every parameter's full state from
the original files by code of our own (digests/<tag>/full-state.json). docs/reshard.md."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from restart_harness import iocount
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import files_under, read_json, write_json_atomic
from restart_harness.spec.runspec import RunSpec

MARKER = ".rh-converted.json"
CONVERTER = "deepspeed.checkpoint.ds_to_universal"


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
        "log": str(log_path.relative_to(run_dir)), "reused": False,
    }
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
    import torch

    from restart_harness.model import digest
    from restart_harness.plan import checkpoint, rules
    from restart_harness.stacks._deepspeed_state import KEYS, merge_tp, split_of

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
