#!/usr/bin/env python3
"""The crossover checked against runs (issue 55 item 3; docs/prediction.md#the-crossover).

Method: docs/benchmark-methods.md#crossover

Usage: <python> -m benchmarks.crossover [REPEATS] [out=DIR] [reuse=true]
       (default 1 round into /tmp/rh-crossover-bench; reuse=true: no runs, evaluate those already there)
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from benchmarks.common import GIB, MIB, measure_then_evaluate, recorded, summary

LOAD = "restart_checkpoint_load_seconds"
RANGE = (1 << 20, 1 << 50)
COMMON = ["iters=2", "save_interval=2", "after=1", "cache=drop", "keep=false"]
TOKENS = ["seq_len=16", "micro_batch=1", "grad_accum=1"]
FAMILIES = {
    "real": [("tiny", ["tiny", *TOKENS]), ("small", ["small", *TOKENS]), ("1B/2", ["1B", "shrink=2", *TOKENS])],
    "emulated": [("1B/8", ["1B", "shrink=8", "emulate=true"]), ("1B/4", ["1B", "shrink=4", "emulate=true"]),
                 ("3B/4", ["3B", "shrink=4", "emulate=true"]), ("70B/16", ["70B", "shrink=16", "emulate=true"])]}


def measure(out: Path, repeats: int) -> None:
    """Every case REPEATS times, the families interleaved; out/cases.json names each run's family and case."""
    file, longest = out / "cases.json", max(len(v) for v in FAMILIES.values())
    recorded(out, repeats, [(fam, f"{fam}: {name}", [*tokens, *COMMON], [fam, name]) for i in range(longest)
                            for fam in FAMILIES if i < len(FAMILIES[fam]) for name, tokens in [FAMILIES[fam][i]]],
             check=False, cases=json.loads(file.read_text()) if file.exists() else {})


def observed(run_dir: Path) -> dict:
    s = summary(run_dir)
    p = s["prediction"]
    phases = {k: v for k, v in p["phases"].items() if k.startswith("restart_") and "total" not in k
              and v.get("predicted") is not None}
    restart = next(r for r in s["restarts"] if r["record"] == "restart-01")
    return {"bytes": s["checkpoint"]["bytes"], "predicted": {k: v["predicted"] for k, v in phases.items()},
            "measured": {k: v["measured"] for k, v in phases.items()}, "crossover": p["crossover"],
            "load_avg": ((s["checkpoint"].get("machine_load") or {}).get("loadavg_1min"),
                         (restart.get("machine_load") or {}).get("loadavg_1min")),
            "read_mib_s": (s.get("baseline") or {}).get("read_mib_s"), "run": run_dir.name}


def fitted(by_case: dict[str, tuple[float, dict[str, float]]]) -> dict[str, tuple[float, float]]:
    """Each phase's line a + b x checkpoint bytes, least-squares on the cases' medians (_medians; a line through one
    point where there is one size)."""
    sizes = [size for size, _ in by_case.values()]
    lines = {}
    for p in next(iter(by_case.values()))[1]:
        ys = [m[p] for _, m in by_case.values()]
        lines[p] = (statistics.mean(ys), 0.0) if len(set(sizes)) < 2 else statistics.linear_regression(sizes, ys)[::-1]
    return lines


def first_above(lines: dict[str, tuple[float, float]], low: float, high: float) -> tuple[float | None, str | None]:
    """The smallest B in [low, high] where the load's line is above every other line, and the line it passes last."""
    a_load, b_load = lines[LOAD]
    start, end, last = low, high, None
    for phase, (a, b) in lines.items():
        if phase == LOAD:
            continue
        if b_load > b:
            edge = (a - a_load) / (b_load - b)
            if edge > start:
                start, last = edge, phase
        elif b_load < b:
            end = min(end, (a - a_load) / (b_load - b))
        elif a_load <= a:
            return None, None
    return (start, last) if start < end and start > low else (None, None)


def short(phase: str | None) -> str:
    return "-" if phase is None else phase.removeprefix("restart_").removesuffix("_seconds")


def gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:,.3f}"


def largest(seconds: dict[str, float]) -> str:
    return max(seconds, key=seconds.get)


def evaluate(out: Path) -> None:
    cases = json.loads((out / "cases.json").read_text())
    runs = [(fam, name, observed(Path(d))) for d, (fam, name) in cases.items() if (Path(d) / "summary.json").exists()]
    print("| family | case | checkpoint GiB | load predicted s | load measured s | load error | largest predicted | "
          "largest measured | side agrees | load avg 1 min (save, restart) | run |")
    print("|---|---|---:|---:|---:|---:|---|---|---|---|---|")
    for fam, name, o in sorted(runs, key=lambda x: (list(FAMILIES).index(x[0]), x[2]["bytes"], x[2]["run"])):
        pl, ml = o["predicted"][LOAD], o["measured"][LOAD]
        largest_p, largest_m = largest(o["predicted"]), largest(o["measured"])
        print(f"| {fam} | {name} | {gib(o['bytes'])} | {pl:.3f} | {ml:.3f} | {(pl - ml) / ml:+.0%} | "
              f"{short(largest_p)} | {short(largest_m)} | "
              f"{'yes' if (largest_p == LOAD) == (largest_m == LOAD) else 'NO'} | "
              f"{o['load_avg'][0]}, {o['load_avg'][1]} | {o['run']} |")
    by_fam = {fam: _medians([(name, o) for f, name, o in runs if f == fam]) for fam in FAMILIES}
    print("\n| family | runs | predicted crossover GiB (median; range over runs) | overtaking (predicted) | "
          "estimated from measurements GiB | overtaking (measured) | crossover error | measured load bandwidth "
          "MiB/s (baseline read MiB/s) | sides agreeing |\n|---|---:|---|---|---:|---|---:|---|---:|")
    for fam, by_case in by_fam.items():
        mine = [o for f, _, o in runs if f == fam]
        if not mine:
            continue
        crossing = [b for o in mine if (b := o["crossover"]["crossover_checkpoint_bytes"])]
        overtakes = {short(o["crossover"].get("overtakes")) for o in mine if o["crossover"].get("overtakes")}
        lines = fitted(by_case)
        estimate, passed = first_above(lines, *RANGE)
        median = statistics.median(crossing) if crossing else None
        error = f"{(median - estimate) / estimate:+.0%}" if median and estimate else "-"
        bandwidth = f"{1 / lines[LOAD][1] / MIB:,.0f}" if lines[LOAD][1] > 0 else "-"
        reads = sorted({round(o["read_mib_s"]) for o in mine if o["read_mib_s"]})
        agree = sum((largest(o["predicted"]) == LOAD) == (largest(o["measured"]) == LOAD) for o in mine)
        spread = f" ({gib(min(crossing))} - {gib(max(crossing))})" if len(crossing) > 1 else ""
        print(f"| {fam} | {len(mine)} | {gib(median)}{spread} | {', '.join(sorted(overtakes)) or '-'} | "
              f"{gib(estimate)} | {short(passed)} | {error} | {bandwidth} ({', '.join(map(str, reads))}) | "
              f"{agree}/{len(mine)} |")
    print("\n| family | case held out | checkpoint GiB | crossover from the other sizes' lines GiB | load predicted s | "
          "load measured s | load error | load largest predicted | measured | side agrees |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|---|")
    for fam, by_case in by_fam.items():
        for held, (size, measured) in by_case.items():
            others = {n: v for n, v in by_case.items() if n != held}
            if len(others) < 2:
                continue
            lines = fitted(others)
            at = {p: a + b * size for p, (a, b) in lines.items()}
            said, seen = largest(at) == LOAD, largest(measured) == LOAD
            print(f"| {fam} | {held} | {gib(size)} | {gib(first_above(lines, *RANGE)[0])} | {at[LOAD]:.3f} | "
                  f"{measured[LOAD]:.3f} | {(at[LOAD] - measured[LOAD]) / measured[LOAD]:+.0%} | "
                  f"{'yes' if said else 'no'} | {'yes' if seen else 'no'} | {'yes' if said == seen else 'NO'} |")
    print(f"\nmachine: {os.cpu_count()} CPUs; load average now {os.getloadavg()[0]:.1f}")


def _medians(cases: list[tuple[str, dict]]) -> dict[str, tuple[float, dict[str, float]]]:
    """Per case: the median checkpoint bytes and each phase's median measured seconds over its repeats."""
    grouped: dict[str, list[dict]] = {}
    for name, o in cases:
        grouped.setdefault(name, []).append(o)
    return {name: (statistics.median(o["bytes"] for o in v),
                   {p: statistics.median(o["measured"][p] for o in v) for p in v[0]["measured"]})
            for name, v in grouped.items()}


if __name__ == "__main__":
    measure_then_evaluate(measure, evaluate, 1, "/tmp/rh-crossover-bench")
