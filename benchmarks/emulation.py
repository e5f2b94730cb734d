#!/usr/bin/env python3
"""Emulated checkpoints (emulate=true) against real ones, and real-size emulations.

Method, `compare` (default): for each case (`tiny` and `small`, dp=2 and tp=2 pp=2, default engine, iters=2
save_interval=2 after=1, cache=drop) a real run and an emulated run, interleaved, REPEATS times. Per pair: the files
(names, kinds, writing ranks equal; the largest size difference in bytes and %); per case, medians over repeats of
the restart's checkpoint_load seconds and load throughput (checkpoint bytes / slowest rank's seconds in the engine's
load calls), real and emulated, and their ratio emulated / real.

Method, `large MODEL LAYOUT...`: one emulated checkpoint and cold restart of a real-size model (e.g.
`large 1B tp=2 pp=2 dp=2`), reporting files, bytes, waves, save blocking/durable seconds and MiB/s, restart
checkpoint_load seconds and load MiB/s (bytes read / seconds), peak RSS per phase, verification.

Usage: .venv/bin/python -m benchmarks.emulation [compare [REPEATS]] | large MODEL key=value ...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import MIB, die, scratch, submitted, summary, words

CASES = {"tiny dp=2": ["tiny", "dp=2"], "tiny tp=2 pp=2": ["tiny", "tp=2", "pp=2"],
         "small dp=2": ["small", "dp=2"], "small tp=2 pp=2": ["small", "tp=2", "pp=2"]}
COMMON = ["iters=2", "save_interval=2", "after=1", "cache=drop"]


def inventory(run_dir: Path) -> dict[str, dict]:
    return {f["path"]: f for f in json.loads((run_dir / "inventory.json").read_text())["files"]}


def compare(repeats: int, results: Path) -> None:
    rows = []
    for name, tokens in CASES.items():
        figures: dict[str, list[float]] = {"rl": [], "el": [], "rm": [], "em": []}
        worst_bytes, worst_pct, same_names = 0, 0.0, True
        for _ in range(repeats):
            real_dir = submitted([*tokens, *COMMON, f"results_dir={results}"])
            emu_dir = submitted([*tokens, *COMMON, "emulate=true", f"results_dir={results}"])
            a, b = inventory(real_dir), inventory(emu_dir)
            same_names &= sorted(a) == sorted(b) and all((a[p]["kind"], a[p]["rank"]) == (b[p]["kind"], b[p]["rank"])
                                                         for p in a if p in b)
            for p in a.keys() & b.keys():
                diff = abs(a[p]["bytes"] - b[p]["bytes"])
                worst_bytes = max(worst_bytes, diff)
                worst_pct = max(worst_pct, 100 * diff / a[p]["bytes"])
            for kind, run_dir in (("r", real_dir), ("e", emu_dir)):
                restart = summary(run_dir)["restart"]
                figures[f"{kind}l"].append(restart["phases"]["checkpoint_load"])
                figures[f"{kind}m"].append(restart["load_throughput_mib_s"])
        m = {k: statistics.median(v) for k, v in figures.items()}
        rows.append(f"| {name} | {'yes' if same_names else 'NO'} | {worst_bytes} ({worst_pct:.3f}%) | {m['rl']:.3f} | "
                    f"{m['el']:.3f} | {m['rm']:,.0f} | {m['em']:,.0f} | {m['em'] / m['rm']:.2f} |")
    print(f"{repeats} repeats per case, real and emulated interleaved; medians; default engine, {' '.join(COMMON)}\n")
    print("| case | names, kinds, writers equal | largest size difference, bytes (%) | real checkpoint_load s | "
          "emulated checkpoint_load s | real load MiB/s | emulated load MiB/s | emulated / real |")
    print("|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))


def large(tokens: list[str], results: Path) -> None:
    run_dir = submitted([*tokens, "emulate=true", "cache=drop", "iters=1", "save_interval=1", f"results_dir={results}"])
    s = summary(run_dir)
    ck, rs = s["checkpoint"], s["restart"]
    save = ck["saves"][-1]
    waves = next(e["waves"] for line in (run_dir / "events" / "checkpoint" / "rank-00000.jsonl").read_text()
                 .splitlines() for e in [json.loads(line)] if e["event"] == "save")
    read = sum(r["read_bytes"] for r in rs["load_breakdown"]["per_rank"])
    load = rs["phases"]["checkpoint_load"]
    peak = max(v["peak_rss_bytes_max"] for v in rs["memory"].values())
    print(f"`{' '.join(tokens)} emulate=true cache=drop`: {ck['files']} files, {ck['bytes'] / 2**30:.2f} GiB, "
          f"{s['spec']['derived']['world_size']} ranks in {waves} wave(s) of emulate_memory_gib="
          f"{s['spec']['emulate_memory_gib']}")
    t = save["throughput_mib_s"]
    print(f"save: per rank in its wave: blocking {save['blocking_seconds']:.1f} s ({t['blocking']:,.0f} MiB/s), "
          f"durable {save['durable_seconds']:.1f} s ({t['durable']:,.0f} MiB/s); whole checkpoint, all waves: "
          f"committed after {save['commit_seconds']:.1f} s ({t['commit']:,.0f} MiB/s)")
    print(f"restart ({rs['cache']['observed']}): checkpoint_load {load:.1f} s, {read / 2**30:.2f} GiB read "
          f"({read / MIB / load:,.0f} MiB/s over the phase), engine load calls {rs['load_seconds']:.1f} s "
          f"({rs['load_throughput_mib_s']:,.0f} MiB/s); verified {rs['verified']} "
          f"({rs['verified_tensors']} tensors); peak RSS {peak / 2**30:.2f} GiB per rank")


def main() -> None:
    mode = (sys.argv[1:2] or ["compare"])[0]
    if mode not in ("compare", "large"):
        die(f"{mode}: accepted: [compare [REPEATS]] | large MODEL key=value ...")
    repeats, _, args = words(3, runs=mode == "large", argv=sys.argv[2:])
    with scratch(f"rh-bench-emulation-{'large-' if mode == 'large' else ''}") as results:
        if mode == "large":
            large(args, results)
        else:
            compare(repeats, results)

if __name__ == "__main__":
    main()
