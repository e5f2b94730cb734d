#!/usr/bin/env python3
"""Checkpoint engines side by side on the `small` preset: median blocking and durable save seconds, throughput.

Method
- Engines: every engine whose plug-in accepts this machine (check() passes: on CPU default, torchsnapshot and
  its async_take variant, dcp and its async_save variant; on CUDA also datastates where installed, fastpersist,
  decoupled), plus engine=none for the step-time baseline.
- Each case is one `./submit-job.sh small dp=2 engine=... iters=6 save_interval=2 after=1 cache=drop` (override
  the layout and counts with extra key=value arguments), run REPEATS times in sequence on an otherwise idle
  machine, cases interleaved per repeat so drift hits all engines alike.
- Per run: for each save, the slowest rank's blocking_seconds (inside save_checkpoint) and durable_seconds (until
  the flush finished and every file is fsync'd), from summary.json; the first save of a run is dropped as warm-up
  when there are more. Per case: medians over all kept saves of all repeats; throughput_mib_s is checkpoint
  bytes / median seconds (2^20 bytes per MiB; MLPerf Storage's bytes over the slowest rank).
- Step seconds: the median training step with and without a flush in flight (rank 0), medians over repeats, to
  show what overlapping a flush costs the training loop; restart load seconds are reported too.

Usage: <python> benchmarks/engines.py [REPEATS] [key=value ...]   (default 3 repeats; prints a Markdown table)
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CASES = [
    ("none", ["engine=none"]),
    ("default", ["engine=default"]),
    ("torchsnapshot", ["engine=torchsnapshot"]),
    ("torchsnapshot async_take", ["engine=torchsnapshot", "async_take=true"]),
    ("dcp", ["engine=dcp"]),
    ("dcp async_save", ["engine=dcp", "async_save=true"]),
    ("datastates", ["engine=datastates"]),
    ("fastpersist", ["engine=fastpersist"]),
    ("decoupled", ["engine=decoupled"]),
]
BASE = ["small", "dp=2", "iters=6", "save_interval=2", "after=1", "cache=drop"]


def runnable(tokens: list[str]) -> bool:
    from restart_harness.errors import UsageError
    from restart_harness.spec import parse_args

    try:
        parse_args(tokens)
        return True
    except UsageError as exc:
        print(f"skipped {' '.join(tokens)}: {exc}", file=sys.stderr)
        return False


def run(tokens: list[str], results: Path) -> dict:
    proc = subprocess.run([str(REPO / "submit-job.sh"), *tokens, f"results_dir={results}"], check=True,
                          capture_output=True, text=True)
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    return json.loads((run_dir / "summary.json").read_text())


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    args = sys.argv[1:]
    repeats = int(args.pop(0)) if args and args[0].isdigit() else 3
    base = BASE + args
    cases = [(name, base + extra) for name, extra in CASES if runnable(base + extra)]
    results = Path(tempfile.mkdtemp(prefix="rh-bench-engines-"))
    collected: dict[str, list[dict]] = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, tokens in cases:
            collected[name].append(run(tokens, results))
    print(f"`{' '.join(base)}`, {repeats} repeats; medians over saves (first save of each run dropped) and runs\n")
    print("| engine | checkpoint MiB | blocking s | durable s | blocking MiB/s | durable MiB/s | step s (no flush) "
          "| step s (flush in flight) | restart load s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, _ in cases:
        summaries = collected[name]
        saves = [s for summary in summaries for s in (summary["checkpoint"]["saves"][1:]
                                                      or summary["checkpoint"]["saves"])]
        nbytes = median([s["bytes"] for s in saves])
        blocking = median([s["blocking_seconds"] for s in saves])
        durable = median([s["durable_seconds"] for s in saves])
        mib = nbytes / 2**20 if nbytes else None
        training = [summary["training"] for summary in summaries]
        no_flush = median([t.get("step_seconds_median_no_flush", t["step_seconds_median"]) for t in training])
        in_flight = median([t.get("step_seconds_median_in_flight") for t in training])
        load = median([(summary["restart"] or {}).get("load_seconds") for summary in summaries])
        print(f"| {name} | {fmt(mib, 1)} | {fmt(blocking)} | {fmt(durable)} "
              f"| {fmt(mib / blocking if mib and blocking else None, 1)} "
              f"| {fmt(mib / durable if mib and durable else None, 1)} | {fmt(no_flush)} | {fmt(in_flight)} "
              f"| {fmt(load)} |")
    shutil.rmtree(results, ignore_errors=True)


if __name__ == "__main__":
    main()
