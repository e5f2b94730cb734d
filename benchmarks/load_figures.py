#!/usr/bin/env python3
"""The harness's two restart-load figures beside an independent timing of the same checkpoint's load, on disk and on a
local S3 gateway (issue 29).

Method: docs/benchmark-methods.md#load_figures

Usage: <python> -m benchmarks.load_figures [REPEATS] [MODEL]   (default 3 small; prints a Markdown table)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


# ---- the plain load, one torchrun rank ------------------------------------------------------------------------------
def plain(checkpoint: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    def reader():
        if not checkpoint.startswith("s3://"):
            return FileSystemReader(checkpoint)
        from s3torchconnector import S3ClientConfig
        from s3torchconnector.dcp import S3StorageReader

        return S3StorageReader(os.environ["AWS_REGION"], checkpoint, s3client_config=S3ClientConfig(force_path_style=True))

    template = {}
    for key, meta in reader().read_metadata().state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            continue
        size = tuple(meta.size)
        if not size:  # a scalar (Adam's step): every rank reads it whole
            template[key] = torch.empty((), dtype=meta.properties.dtype)
            continue
        rows = torch.empty(size[0]).chunk(world)  # FSDP2 shards dim 0 the way torch.chunk does
        local = (rows[rank].numel() if rank < len(rows) else 0, *size[1:])
        template[key] = DTensor.from_local(torch.empty(local, dtype=meta.properties.dtype), mesh, [Shard(0)],
                                           shape=torch.Size(size), stride=torch.empty(size, device="meta").stride())
    dist.barrier()
    start = time.perf_counter()
    dcp.load(template, storage_reader=reader())
    seconds = time.perf_counter() - start
    dist.barrier()
    Path(f"{out}.{rank}").write_text(json.dumps({"rank": rank, "seconds": seconds}))
    dist.destroy_process_group()


# ---- the benchmark ------------------------------------------------------------------------------------------------------
def _measure(target: str, model: str, folder: Path) -> dict:
    """One run on target, then the plain load of its checkpoint (on S3: the checkpoint deleted after)."""
    from benchmarks.common import submitted, summary  # lazily: torchrun runs this file as a script (plain)

    run_dir = submitted([model, "dp=2", "stack=fsdp2", "iters=2", "save_interval=2", "after=1", "baseline=false",
                         *(["ckpt_dir=s3://bench/runs"] if target == "s3" else []),
                         f"results_dir={folder / 'results'}"], python=sys.executable)
    s = summary(run_dir)
    spec = json.loads((run_dir / "spec.json").read_text())
    where = f"{spec['checkpoint_url' if target == 's3' else 'checkpoint_root']}/{s['checkpoint']['tag']}"
    os.sync()
    with contextlib.suppress(OSError):  # not root: the restart says what it observed; the plain load may be warm
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    out = folder / f"plain-{time.time_ns()}"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29611",
                    __file__, "plain", where, str(out)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                   capture_output=True, text=True)
    seconds = max(json.loads(Path(f"{out}.{r}").read_text())["seconds"] for r in range(2))
    rs = s["restart"]
    if target == "s3":
        shutil.rmtree(run_dir / "checkpoint", ignore_errors=True)
        from restart_harness import resolve

        resolve.read(run_dir).stored.delete()
    return {"bytes": s["checkpoint"]["bytes"], "plain_mib_s": s["checkpoint"]["bytes"] / 2**20 / seconds,
            "waited_mib_s": rs["load_throughput_mib_s"], "storage_read_mib_s": rs["storage_read_throughput_mib_s"],
            "load": rs["load_breakdown"]}


def main(repeats: int, model: str) -> None:
    from benchmarks.common import object_store, scratch

    rows: dict[str, list[dict]] = {"fs": [], "s3": []}
    with object_store("rh-bench-s3", 4096), scratch("rh-load-figures-") as folder:
        for n in range(repeats):
            for target in ("fs", "s3"):
                r = _measure(target, model, Path(folder))
                rows[target].append(r)
                print(f"[{n + 1}/{repeats} {target}] plain {r['plain_mib_s']:.1f} MiB/s, harness "
                      f"waited {r['waited_mib_s']:.1f}, storage read {r['storage_read_mib_s']:.1f}",
                      file=sys.stderr, flush=True)
    print(f"`benchmarks/load_figures.py {repeats} {model}` (fsdp2 dp=2, medians of {repeats} interleaved repeats)\n")
    print("| target | checkpoint MiB | plain dcp.load MiB/s | harness waited MiB/s (x plain) | harness storage read "
          "MiB/s (x plain) | load anatomy of the slowest rank: read / deserialize / copy / wait / other s |")
    print("|---|---|---|---|---|---|")
    for target, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("bytes", "plain_mib_s", "waited_mib_s",
                                                                 "storage_read_mib_s")}
        cats = " / ".join(f"{statistics.median(r['load'][c + '_seconds'] for r in rs):.2f}"
                          for c in ("read", "deserialize", "copy", "wait", "other"))
        print(f"| {target} | {med['bytes'] / 2**20:,.0f} | {med['plain_mib_s']:.1f} | {med['waited_mib_s']:.1f} "
              f"({med['waited_mib_s'] / med['plain_mib_s']:.2f}) | {med['storage_read_mib_s']:.1f} "
              f"({med['storage_read_mib_s'] / med['plain_mib_s']:.2f}) | {cats} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "plain":
        plain(sys.argv[2], sys.argv[3])
    else:
        from benchmarks.common import words

        repeats, _, model = words(3, runs=True)
        main(repeats, (model or ["small"])[0])
