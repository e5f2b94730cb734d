#!/usr/bin/env python3
"""A restart's I/O besides the checkpoint, and what a cold Python environment costs it: per launcher, the same
checkpoint restarted with the environment's page cache dropped (env_cache=drop) and kept (env_cache=warm).

Method: docs/benchmark-methods.md#restart_io

Usage: <python> -m benchmarks.restart_io [REPEATS] [launcher=L,L] [key=value ...]   (a Markdown table)
"""

from __future__ import annotations

import statistics

from benchmarks.common import MIB, restarted, scratch, spread, submitted, words


def figures(restart: dict) -> dict:
    from restart_harness.schema import io_metadata_ops

    io = restart["io_sources"]
    n = io["ranks"]
    rest = [c for name, c in io["total"]["sources"].items() if name != "checkpoint"]
    kernel = io["total"]["kernel"]
    return {
        "imports_s": restart["phases"]["imports"], "engine_init_s": restart["phases"]["engine_init"],
        "total_s": restart["total_seconds"],
        "ops": sum(io_metadata_ops(c) for c in rest) / n, "read_mib": sum(c.get("read_bytes", 0) for c in rest) / n / MIB,
        "delivered_mib": kernel.get("storage_read_bytes", 0) / n / MIB, "faults": kernel.get("major_faults", 0) / n,
        "imports_delivered_mib": io["phases"]["imports"]["kernel"].get("storage_read_bytes", 0) / n / MIB,
        "observed": (restart.get("environment_cache") or {}).get("observed")}


def main() -> None:
    repeats, named, args = words(3, "launcher", runs=True)
    rows = []
    with scratch("rh-restart-io-") as results:
        for launcher in named.get("launcher", "deepspeed,mpiexec").split(","):
            run = submitted(["tiny", "dp=2", f"launcher={launcher}", "phase=checkpoint", "baseline=false",
                             f"results_dir={results}", *args])
            got: dict[str, list[dict]] = {"drop": [], "warm": []}
            for _ in range(repeats):
                for env_cache, runs in got.items():
                    runs.append(figures(restarted(run, [f"env_cache={env_cache}", "cache=drop"])))
            rows += [(launcher, env_cache, runs) for env_cache, runs in got.items()]

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    print(f"| launcher | env_cache (observed) | imports s | engine_init s | start -> first step s | metadata ops / rank "
          f"| MiB read / rank | storage delivered MiB / rank (imports) | major faults / rank |  ({repeats} restarts each, "
          "median (min-max))\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for launcher, env_cache, runs in rows:
        observed = ", ".join(sorted({str(r["observed"]) for r in runs}))
        seconds = " | ".join(spread([r[k] for r in runs]) for k in ("imports_s", "engine_init_s", "total_s"))
        print(f"| {launcher} | {env_cache} ({observed}) | {seconds} | {med(runs, 'ops'):,.0f} "
              f"| {med(runs, 'read_mib'):.1f} | {med(runs, 'delivered_mib'):.1f} ({med(runs, 'imports_delivered_mib'):.1f}) "
              f"| {med(runs, 'faults'):.0f} |")


if __name__ == "__main__":
    main()
