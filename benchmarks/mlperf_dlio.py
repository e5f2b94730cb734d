#!/usr/bin/env python3
"""MLPerf Storage's 8B checkpoint workload, scaled down, written and read by DLIO (MLPerf's tool) and by the
harness (DeepSpeed 0.19.8's own files, emulated), side by side on the same storage.

Method
- Workload: MLPerf Storage v2.0's llama3-8b (TPxPPxDP 1x1x8, ZeRO-3, 8 ranks), every dimension that shrink=K divides
  divided by K in both tools: hidden 4096/K, FFN 14336/K, vocabulary 128256/K; 32 layers, 32 heads, 8 KV heads kept
  (DLIO's `llama_8b_zero3` workload with `++workload.model.transformer.*` overrides; the harness's `mlperf llama3-8b
  shrink=K`). Both count the same parameters (1,964,608 at K=64).
- Each repeat, interleaved: DLIO writes C checkpoints (`num_checkpoints_read=0`, `time_between_checkpoints=0`: the
  harness writes back to back too; fsync on, DLIO's default for the workload), the checkpoint files are evicted from
  the page cache (drop_caches, checked with mincore), DLIO reads C checkpoints (`num_checkpoints_write=0`); then
  `./submit-job.sh mlperf llama3-8b shrink=K runs=1 checkpoints=C reads=C` (each read a cold restart).
- MLPerf's figures for both, as its rules define them: per checkpoint the maximum over ranks of the rank's duration
  (DLIO: its per-rank `N_per_epoch_stats.json`; the harness: mlperf.json), throughput = checkpoint size / that
  duration; means over the checkpoints; medians over repeats. DLIO's own size (its log's "Total checkpoint size",
  GiB) is used for its throughput, the harness's bytes written for its own; the files are listed for both.
- DLIO runs with MPI (`mpirun -np 8 --oversubscribe`), one OpenMP thread per rank, from the Python given with
  --dlio-python (an environment with dlio_benchmark installed: docs/benchmarks.md says how).

Usage: .venv/bin/python -m benchmarks.mlperf_dlio --dlio-python PATH [--repeats 3] [--shrink 64] [--checkpoints 3]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import GIB, REPO, scratch
from restart_harness.files import pagecache

SHAPE = {"hidden_size": 4096, "ffn_hidden_size": 14336, "vocab_size": 128256}


def dlio(python: str, workdir: Path, shrink: int, writes: int, reads: int, out: Path) -> str:
    overrides = [f"++workload.model.transformer.{k}={v // shrink}" for k, v in SHAPE.items()]
    cmd = ["mpirun", "-np", "8", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-x", "OMP_NUM_THREADS=1", python, "-m", "dlio_benchmark.main", "workload=llama_8b_zero3", *overrides,
           f"++workload.checkpoint.checkpoint_folder={workdir / 'ckpt'}",
           f"++workload.checkpoint.num_checkpoints_write={writes}",
           f"++workload.checkpoint.num_checkpoints_read={reads}",
           "++workload.checkpoint.time_between_checkpoints=0", f"++workload.output.folder={out}",
           f"hydra.run.dir={workdir / 'hydra'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=1800, check=False)
    if proc.returncode != 0:
        sys.exit(f"DLIO failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def dlio_figures(out: Path, kind: str, size_gib: float) -> dict:
    """Per checkpoint, the slowest rank's duration (MLPerf's metric), then the mean over checkpoints."""
    per_ckpt: dict[str, list[float]] = {}
    for path in out.glob("*_per_epoch_stats.json"):
        for epoch in json.loads(path.read_text()).values():
            for name, entry in epoch.items():
                if name.startswith(f"{kind}_ckpt") and isinstance(entry, dict):
                    per_ckpt.setdefault(name, []).append(float(entry["duration"]))
    slowest = [max(v) for v in per_ckpt.values()]
    return {"duration_seconds": statistics.fmean(slowest),
            "throughput_gib_s": statistics.fmean(size_gib / s for s in slowest), "checkpoints": len(slowest)}


def repeat(python: str, shrink: int, checkpoints: int, results: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rh-dlio-", dir=results))
    log = dlio(python, work, shrink, checkpoints, 0, work / "out-write")
    size_gib = float(re.search(r"Total checkpoint size: ([0-9.]+) GB", log).group(1))
    ckpt = work / "ckpt"
    files = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    cache = pagecache.prepare([ckpt / f for f in files], "drop")
    dlio(python, work, shrink, 0, checkpoints, work / "out-read")
    d = {"save": dlio_figures(work / "out-write", "save", size_gib),
         "load": dlio_figures(work / "out-read", "load", size_gib),
         "size_gib": size_gib, "files": files, "cache": cache["observed"]}
    shutil.rmtree(work)
    proc = subprocess.run([str(REPO / "submit-job.sh"), "mlperf", "llama3-8b", f"shrink={shrink}", "runs=1",
                           f"checkpoints={checkpoints}", f"reads={checkpoints}", f"results_dir={results}",
                           "keep=true"], capture_output=True, text=True, timeout=3600, check=True)
    folder = Path(proc.stdout.strip().splitlines()[-1])
    record = json.loads((folder / "mlperf.json").read_text())
    inventory = json.loads((Path(record["run_dirs"][0]) / "inventory.json").read_text())
    run = record["per_run"][0]
    h = {"save": {"duration_seconds": run["save_duration_seconds"], "throughput_gib_s": run["save_throughput_gib_s"]},
         "load": {"duration_seconds": run["load_duration_seconds"], "throughput_gib_s": run["load_throughput_gib_s"]},
         "size_gib": run["writes"][-1]["bytes"] / GIB,
         "files": {f["path"]: f["bytes"] for f in inventory["files"]},
         "cache": ",".join(run["harness"]["cache_observed"])}
    shutil.rmtree(folder)
    return {"dlio": d, "harness": h}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dlio-python", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shrink", type=int, default=64)
    parser.add_argument("--checkpoints", type=int, default=3)
    args = parser.parse_args()
    reps = []
    with scratch("rh-bench-mlperf-dlio-") as results:
        for n in range(args.repeats):
            print(f"repeat {n + 1}/{args.repeats}", file=sys.stderr, flush=True)
            reps.append(repeat(args.dlio_python, args.shrink, args.checkpoints, results))
    last = reps[-1]
    print(f"llama3-8b shrink={args.shrink}, 8 ranks, ZeRO-3; {args.checkpoints} writes and {args.checkpoints} "
          f"cold reads per repeat, {args.repeats} repeats interleaved; medians; GiB = 2^30 bytes\n")
    print("| figure | DLIO | harness | harness / DLIO |\n|---|---|---|---|")
    a, b = last["dlio"]["size_gib"], last["harness"]["size_gib"]
    print(f"| checkpoint size (GiB) | {a:.6f} | {b:.6f} | {b / a:.3f} |")
    for phase in ("save", "load"):
        for name, unit in (("duration_seconds", "s"), ("throughput_gib_s", "GiB/s")):
            a, b = (statistics.median(r[tool][phase][name] for r in reps) for tool in ("dlio", "harness"))
            print(f"| {phase} {name.split('_')[0]} ({unit}), MLPerf's metric | {a:.4f} | {b:.4f} | {b / a:.2f} |")
    print(f"\npage cache before the reads: DLIO {', '.join(r['dlio']['cache'] for r in reps)}; harness "
          f"{', '.join(r['harness']['cache'] for r in reps)}\n")
    for tool in ("dlio", "harness"):
        files = last[tool]["files"]  # DLIO: every checkpoint's folder; the harness: the latest checkpoint's files
        steps = sorted({f.split("/")[0] for f in files if "/" in f})
        mine = {f: b for f, b in files.items() if not steps or f.startswith(steps[-1] + "/")}
        print(f"{tool}: {len(mine)} files per checkpoint, {sum(mine.values()):,} bytes; "
              + "; ".join(f"{Path(f).name} {b:,}" for f, b in sorted(mine.items())[:2] + sorted(mine.items())[-2:]))


if __name__ == "__main__":
    main()
