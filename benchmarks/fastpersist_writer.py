#!/usr/bin/env python3
"""torch.save against DeepSpeed's FastPersist writer on this machine's disk, with dd's direct I/O as the device's
figure in the same run: the shape of the FastPersist paper's micro-benchmark (issue 27).

Method: docs/benchmark-methods.md#fastpersist_writer

Usage: <python> -m benchmarks.fastpersist_writer [REPEATS] [SIZE_MIB]   (default 5 512; prints a Markdown table)
RH_BENCH_DIR: the folder the files go to (default: a temporary folder under the repository).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from benchmarks.common import REPO, die, table
from restart_harness.files.cache_dir import extensions_dir

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))  # the harness's built ops


def payloads(size_mib: int) -> dict:
    import torch

    d, layer, i, total = 1024, {}, 0, 0
    while total < size_mib * 2**20:
        for j, shape in enumerate([(d, d)] * 4 + [(d, 4 * d)] * 3 + [(d,)] * 2):
            for dtype, kind in ((torch.bfloat16, "weight"), (torch.float32, "exp_avg")):
                t = torch.randn(shape, dtype=dtype)
                layer[f"layers.{i}.{j}.{kind}"] = t
                total += t.nbytes
        i += 1
    return {"tensor": torch.randint(0, 255, (size_mib * 2**20,), dtype=torch.uint8), "state_dict": layer}


def fastpersist_factory():
    """DeepSpeed's CheckpointWriterFactory for checkpoint.writer type fast, from DeepSpeed's own config parsing."""
    from deepspeed.runtime.model_checkpointing.config import get_checkpoint_writer_config
    from deepspeed.runtime.model_checkpointing.data_parallel_writer_factory import DataParallelWriterConfig
    from deepspeed.runtime.model_checkpointing.writer_factory import CheckpointWriterFactory
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config

    from third_party.deepspeed_fastpersist_cpu import prepare

    prepare("cpu")
    writer = get_checkpoint_writer_config({"writer": {"type": "fast", "io_buffer_size": 64 * 2**20,
                                                      "io_buffer_double": True}})
    only = DataParallelWriterConfig(world_size=1, rank=0, global_rank=0, local_rank=0, pure_dp=True)
    return CheckpointWriterFactory(writer, get_aio_config({}), only)


def torch_save(obj, path: Path) -> None:
    import torch

    torch.save(obj, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fastpersist_save(factory, obj, path: Path) -> None:
    import torch

    torch.save(obj, factory.create_writer(str(path), False))
    factory.release_writer()  # FastFileWriter drains its buffers and fsyncs the file


def dd(path: Path, size_mib: int) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={size_mib}", "oflag=direct", "conv=fsync"],
                   check=True, capture_output=True)


def timed(path: Path, fn, *args) -> float:
    """GB/s (10^9 bytes) of one write fn(*args) to path: the file's bytes over the seconds to the end of its fsync."""
    start = time.perf_counter()
    fn(*args)
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    path.unlink()
    return size / seconds / 1e9


def main(repeats: int = 5, size_mib: int = 512) -> None:
    import torch

    folder = Path(tempfile.mkdtemp(prefix="fastpersist-bench-", dir=os.environ.get("RH_BENCH_DIR", REPO)))
    data = payloads(size_mib)
    factory = fastpersist_factory()
    figures: dict[tuple[str, str], list[float]] = {}
    for r in range(repeats):
        for name, obj in data.items():
            path = folder / f"{name}.pt"
            for way, fn, args in (("dd", dd, (path, size_mib)), ("torch.save", torch_save, (obj, path)),
                                  ("fastpersist", fastpersist_save, (factory, obj, path))):
                figures.setdefault((way, name), []).append(timed(path, fn, *args))
        print(f"repeat {r + 1}/{repeats} done", file=sys.stderr)
    folder.rmdir()
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"{size_mib} MiB payloads, {repeats} interleaved repeats, torch threads {torch.get_num_threads()}, "
          f"files in {folder.parent}\n")
    table(["payload", "dd direct GB/s", "torch.save GB/s", "fastpersist GB/s", "fastpersist / torch.save",
           "fastpersist / dd", "torch.save / dd"],
          ([name, f"{d:.3f}", f"{t:.3f}", f"{f:.3f}", f"{f / t:.2f}", f"{f / d:.2f}", f"{t / d:.2f}"] for name in data
           for d, t, f in [(med[("dd", name)], med[("torch.save", name)], med[("fastpersist", name)])]))


if __name__ == "__main__":
    if not all(a.isdigit() and int(a) > 0 for a in sys.argv[1:]) or len(sys.argv) > 3:
        die(f"{' '.join(sys.argv[1:])}: accepted: [REPEATS] [SIZE_MIB], whole numbers above 0")
    main(*(int(a) for a in sys.argv[1:3]))
