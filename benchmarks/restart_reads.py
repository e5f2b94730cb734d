#!/usr/bin/env python3
"""How engine=lazy should read at restart: restart-only re-runs of one checkpoint, each way of reading interleaved.

Method
- One `phase=checkpoint` run of MODEL (default `small dp=2 iters=4 save_interval=2 precision=fp32`) with
  engine=lazy; or RUN=DIR, an existing lazy run (its checkpoint is not changed: each re-run is a record of its own).
- ROUNDS rounds (default 5); each round one restart-only re-run per way (the engine's restart-time keys: read_io,
  readers, broadcast_load), in an order rotated every round so that no way always follows another; every restart
  `cache=drop` (the checkpoint read cold; the environment as the run left it).
- Per way: the median over the rounds of `load_seconds` (what the restart waited for: the checkpoint's bytes over
  the slowest rank's seconds inside the engine's loads) and of the storage read (bytes over the slowest rank's time
  with a read in flight), and how often the way was the round's fastest; the disk here moves 2-5x within minutes, so
  only the paired rounds say which way is sooner, not a single figure.

Usage: <python> -m benchmarks.restart_reads [ROUNDS] [RUN=DIR | MODEL key=value ...] [ways=LABEL:k=v+k=v,...]
       (default ways: direct+broadcast, direct+shared, buffered+shared; prints a Markdown table)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.common import restarted, rotated, spread, submitted, summary, words

WAYS = {
    "O_DIRECT, broadcast": ["read_io=direct", "broadcast_load=true"],
    "O_DIRECT, shared": ["read_io=direct", "broadcast_load=auto"],
    "buffered, shared": ["read_io=buffered", "broadcast_load=auto"],
}


def main(argv: list[str]) -> int:
    rounds, named, rest = words(5, "RUN", "ways", argv=argv)
    ways = {w.split(":", 1)[0]: w.split(":", 1)[1].split("+") for w in named["ways"].split(",")} \
        if "ways" in named else dict(WAYS)
    run = Path(named["RUN"]) if "RUN" in named else None
    if run is None:
        tokens = rest or ["small", "dp=2", "iters=4", "save_interval=2", "precision=fp32"]
        run = submitted([*tokens, "engine=lazy", "phase=checkpoint"], python=sys.executable)
        print(f"checkpoint run: {run}", file=sys.stderr)
    labels = list(ways)
    seen: dict[str, list[dict]] = {w: [] for w in labels}
    for r in range(rounds):
        for label in rotated(labels, r):
            print(f"round {r + 1}/{rounds}: {label}", file=sys.stderr)
            latest = restarted(run, ["cache=drop", *ways[label]], python=sys.executable)
            sr = (latest.get("load_breakdown") or {}).get("storage_read") or {}
            seen[label].append({"load": latest["load_seconds"], "read_mib_s": sr.get("throughput_mib_s"),
                                "verified": latest["verified"]})
    fastest = [min(labels, key=lambda w: seen[w][r]["load"]) for r in range(rounds)]
    mib = summary(run)["checkpoint"]["bytes"] / 2**20
    print(f"`{run.name}`: {mib:,.1f} MiB a checkpoint, {rounds} rounds, each way once a round (rotated), "
          "`cache=drop`; medians over the rounds (min-max)\n")
    print("| way | keys | load s | load MiB/s | storage read MiB/s | fastest in | verified |")
    print("|---|---|---:|---:|---:|---:|---|")
    for w in labels:
        loads = [s["load"] for s in seen[w]]
        reads = [s["read_mib_s"] for s in seen[w] if s["read_mib_s"]]
        print(f"| {w} | {' '.join(ways[w])} | {spread(loads, '.3f')} | {mib / statistics.median(loads):,.0f} "
              f"| {statistics.median(reads):,.0f} | {fastest.count(w)} of {rounds} "
              f"| {all(s['verified'] for s in seen[w])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
