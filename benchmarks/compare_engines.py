#!/usr/bin/env python3
"""Every checkpoint engine that runs here, side by side, against the storage's own limit as fio measures it (named
compare_engines.py: a script named engines.py would shadow the engines package).

Method: docs/benchmark-methods.md#compare_engines

Usage: <python> -m benchmarks.compare_engines [REPEATS] [MODEL] [only=LABEL,...] [targets=fs,s3] [key=value ...]
       (default 3 small dp=2, every engine that runs here, on the file system; Markdown tables)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import MIB, die, median, object_store, scratch, spread, submitted, summary, table, words

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
    ("lazy", ["engine=lazy"]),
    ("lazy buffered", ["engine=lazy", "direct_io=false", "read_io=buffered"]),  # page-cache writes and reads
    ("lazy staged whole", ["engine=lazy", "staging_mib=1048576"]),  # every part staged whole, as before 2026-11-27
    ("lazy ring", ["engine=lazy", "staging_mib=64"]),  # a ring of 64 MiB a part: on CUDA, the ring's copy path
    ("lazy O_DIRECT reads", ["engine=lazy", "read_io=direct"]),  # reads O_DIRECT whatever the probe found faster
    ("lazy every replica reads", ["engine=lazy", "broadcast_load=false"]),  # without the shared or broadcast load
    ("lazy broadcast", ["engine=lazy", "broadcast_load=true"]),
    # the PyTorch-native stack: the same model and data, FSDP2 sharding, one collective DCP save per checkpoint
    ("fsdp2 none", ["stack=fsdp2", "engine=none"]),
    ("fsdp2 dcp", ["stack=fsdp2", "engine=dcp"]),
    ("fsdp2 dcp async_save", ["stack=fsdp2", "engine=dcp", "async_save=true"])]
# every engine, one case each (dcp on FSDP2, the stack it is made for, with that stack's own baseline step)
EVERY_ENGINE = ("none", "default", "torchsnapshot", "fsdp2 none", "fsdp2 dcp", "fastpersist", "decoupled",
                "datastates", "lazy")
# keep=true: each run's checkpoint stays for fio to read the files its restart read (read_by_fio), then the benchmark
# deletes it (the repeats' would fill the disk); an S3 case's is deleted by the run (keep=false)
BASE = ["dp=2", "iters=6", "save_interval=2", "after=1", "cache=drop", "keep=true"]
BASELINE_FILE_MIB = 256
S3_TARGET = "ckpt_dir=s3://bench/runs"


def why_not(tokens: list[str]) -> str | None:
    """None where the case runs here, else the engine's (or the spec's) own reason."""
    from restart_harness import machine, resolve
    from restart_harness.command import parse_args
    from restart_harness.errors import UsageError

    try:
        resolve.plugins(machine.resolve(parse_args(tokens))).engine.check()  # e.g. CUDA-only engines on a CPU
        return None
    except UsageError as exc:
        return str(exc)


def choose(only: list[str] | None, base: list[str]) -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """The cases to run and those left out with why; a case named in only= that cannot run here is bad input."""
    labels = [n for n, _ in CASES]
    if unknown := sorted(set(only or ()) - set(labels)):
        die(f"only=: unknown case(s) {', '.join(unknown)}; cases: {', '.join(labels)}")
    chosen = [(n, base + extra) for n, extra in CASES if n in (only or EVERY_ENGINE)]
    refused = {n: why for n, tokens in chosen if (why := why_not(tokens))}
    if only and refused:
        can = [n for n, extra in CASES if n in EVERY_ENGINE and not why_not(base + extra)]
        name, why = next(iter(refused.items()))
        die(f"only=: {name} cannot run here ({why}); engines that can: {', '.join(can)}")
    return [(n, t) for n, t in chosen if n not in refused], refused


def ceiling_tool(where: Path) -> tuple[str, str]:
    """(the baseline's tool, how the ceiling was measured): fio where it is installed and can write with O_DIRECT in
    `where` (a 1 MiB file, removed), else the built-in probe, said in one line."""
    if shutil.which("fio") is None:
        print("fio is not installed: the ceiling falls back to the built-in probe (marked so)", file=sys.stderr)
        return "builtin", "the BUILT-IN PROBE (fio is not installed)"
    name = f".rh-direct-check-{os.getpid()}"
    proc = subprocess.run(["fio", "--name=rh-direct-check", f"--directory={where}", f"--filename={name}", "--rw=write",
                           "--bs=1M", "--size=1M", "--direct=1", "--ioengine=psync"], capture_output=True, text=True,
                          check=False, timeout=120)
    (where / name).unlink(missing_ok=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        print(f"fio cannot do direct I/O in {where} ({why}): the ceiling falls back to the built-in probe (marked "
              "so)", file=sys.stderr)
        return "builtin", f"the BUILT-IN PROBE (fio cannot do direct I/O in {where}: {why})"
    return "fio", "fio's grid (O_DIRECT, libaio) and the built-in probe"


def main() -> None:
    repeats, named, args = words(3, "only", "targets", runs=True)
    model = args.pop(0) if args and "=" not in args[0] else "small"
    only = named["only"].split(",") if "only" in named else None
    targets = named.get("targets", "fs").split(",")
    if set(targets) - {"fs", "s3"}:
        die(f"targets={','.join(targets)}: accepted fs, s3 (comma list)")
    given = {a.split("=", 1)[0] for a in args}
    base = [model, *(b for b in BASE if b.split("=", 1)[0] not in given), *args]
    if why := why_not(base):  # the model or a key=value every case shares
        die(why)
    cases, refused = choose(only, base)
    tool, how = ceiling_tool(Path(tempfile.gettempdir()))
    cases = cases if "fs" in targets else []
    with object_store("rh-bench-s3", 6144) if "s3" in targets else contextlib.nullcontext():
        if "s3" in targets:
            cases += [(f"{n} s3", s3) for n, t in choose(only, base)[0]
                      if not why_not(s3 := [*(x for x in t if not x.startswith("keep=")), "keep=false", S3_TARGET])]
        measure(cases, base, repeats, targets, (tool, how, refused))


def measure(cases: list[tuple[str, list[str]]], base: list[str], repeats: int, targets: list[str],
            how: tuple[str, str, dict[str, str]]) -> None:
    """The repeats, interleaved: each repeat's storage probes, then every case once; then the tables."""
    from restart_harness.command import parse_args

    world = parse_args(base).world_size
    collected: dict[str, list[dict | None]] = {name: [] for name, _ in cases}
    storage: dict[str, list[dict]] = {t: [] for t in targets}
    loads = []  # the 1-minute load average before and after each repeat
    with scratch("rh-bench-engines-") as results:
        for r in range(repeats):
            loads.append(os.getloadavg()[0])
            for target in targets:  # a fresh baseline of the results folder (or S3), its ceiling with it: the
                # record the command cached (its last line: `measured_at ...; cached in PATH.json (whose cache)`)
                said = str(submitted(["baseline", f"dir={results if target == 'fs' else 's3://bench/probe'}",
                                      f"ranks={world}", f"file_bytes={BASELINE_FILE_MIB}MiB",
                                      f"tool={how[0] if target == 'fs' else 'auto'}"]))
                storage[target].append(json.loads(Path(said.rsplit("cached in ", 1)[1].rsplit(".json", 1)[0]
                                                       + ".json").read_text()))
            for name, tokens in cases:
                print(f"repeat {r + 1}/{repeats}: {name}", file=sys.stderr, flush=True)
                run = submitted([*tokens, f"results_dir={results}"], check=False)  # a failed run: said, left out
                collected[name].append(read_by_fio(run, results) if run else None)
            loads.append(os.getloadavg()[0])
    ceilings = {t: [b.get("ceiling") or {"write_mib_s": b["write_mib_s"], "read_mib_s": b["read_mib_s"],
                                         "write_from": "baseline", "read_from": "baseline"} for b in storage[t]]
                for t in targets}
    _header(base, repeats, world, how, ceilings, loads, collected)
    steps = {label: [s and s["training"]["step_seconds_median"] for s in collected.get(label, [])]
             for label in ("none", "fsdp2 none")}
    rows = {name: _row(collected[name], ceilings["s3" if name.endswith(" s3") else "fs"],
                       steps["fsdp2 none" if name.startswith("fsdp2") else "none"]) for name, _ in cases}
    table(["engine", *(c for c, _, _ in COLUMNS)], ([name, *(efficiency(r[k], _why_above(r, k)) if k.startswith("x_")
                                                             else cell(r[k], d) for _, k, d in COLUMNS)]
                                                   for name, r in rows.items() if r))
    digest, blocking = (median((rows.get("default") or {}).get(k) or []) for k in ("digest", "blocking"))
    if digest is not None and blocking:  # the harness's own seconds beside the saves' (rank 0, before each save)
        print(f"\nThe harness's own: its verification digest before each of default's saves, outside every figure "
              f"above: median {digest:.4f} s a save, {digest / blocking:.1%} of default's median blocking save "
              f"({blocking:.3f} s).")
    _ranking(rows)
    _grid_table(ceilings.get("fs") or [], rows)
    _reads(rows, collected)


def read_by_fio(run: Path, results: str) -> dict:
    """The run's summary, with `fio_files_seconds` where fio can read its checkpoint: the seconds fio's faster shape
    (FIO) took to read, cold, the files of 1 MiB or more each rank read at restart (scaled to their whole bytes),
    each fio job holding as much memory as the restart's largest rank (common.fio_read);
    then the checkpoint, which the benchmark kept for this, is deleted (a folder under its own results only)."""
    from benchmarks.common import FIO, fio_read, read_files

    s = summary(run)
    root = Path(s["checkpoint"].get("root") or "")
    if s.get("restart") and (files := read_files(run, s["restart"])):
        reads = [fio_read(files, shape, s["restart"].get("max_rss_bytes_per_rank") or 0) for shape in FIO.values()]
        s["fio_files_seconds"] = min(seconds * whole / done for done, seconds, whole in reads)
    if root.is_dir() and root.resolve().is_relative_to(Path(results).resolve()):
        shutil.rmtree(root)
    return s


def _header(base: list[str], repeats: int, world: int, how: tuple[str, str, dict[str, str]], ceilings: dict,
            loads: list[float], collected: dict[str, list[dict]]) -> None:
    """What was run, what was left out and why, the ceilings and where they came from, how busy the machine was."""
    busy = [b for runs in collected.values() for s in runs
            if s and (b := (s["checkpoint"].get("machine_load") or {}).get("cpu_busy_fraction")) is not None]
    print(f"`{' '.join(base)}`, {repeats} repeats, cases interleaved; medians over the repeats (min-max). "
          f"Ceiling per repeat ({world} ranks x {BASELINE_FILE_MIB} MiB) from {how[1]}: "
          + "; ".join(f"{'file system' if t == 'fs' else 'local S3 (RGW)'} " + ", ".join(
              f"{way} {median(v):,.0f} MiB/s ({min(v):,.0f}-{max(v):,.0f}; from "
              f"{' and '.join(sorted({x[f'{way}_from'] for x in c}))})"
              for way in ("write", "read") for v in [[x[f"{way}_mib_s"] for x in c]]) for t, c in ceilings.items())
          + f". Machine: 1-minute load average {min(loads):.1f}-{max(loads):.1f} over the repeats"
          + (f", other work on the CPUs before a launch {median(busy):.0%} (median; {min(busy):.0%}-{max(busy):.0%})"
             if busy else "") + "; " + _memory() + ".")
    for name, why in how[2].items():
        print(f"- not run here: {name} ({why})")
    print()


def _memory() -> str:
    """Whether the kernel hands free memory back to a hypervisor, which every engine's figures depend on."""
    from restart_harness.files.kernel_memory import free_page_reporting_order, reporting_said

    return reporting_said(free_page_reporting_order()) or "no free page reporting (fresh memory faults in as on a node)"


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def _run(summary: dict, ceiling: dict, none_step: float | None) -> dict:
    """One run's figures (medians over its saves but the first, a warm-up, where there are more) and their ratios to
    its repeat's ceiling; storage read (results/breakdown.py): all ranks' bytes over the slowest rank's read busy."""
    saves, restart = summary["checkpoint"]["saves"][1:] or summary["checkpoint"]["saves"], summary.get("restart") or {}
    storage_read = (restart.get("load_breakdown") or {}).get("storage_read") or {}
    nbytes = median([s["bytes"] for s in saves])
    durable = median([s["durable_seconds"] for s in saves])
    lost = [tl["window_seconds"] - tl["steps_in_window"] * none_step for s in saves
            if (tl := s.get("training_lost") or {}).get("window_seconds") is not None and none_step is not None]
    rank = (summary["checkpoint"].get("bytes_per_rank") or {}).get("max")
    held = (summary["checkpoint"].get("memory") or {}).get("held_bytes_max")
    f = {"mib": nbytes / MIB if nbytes else None, "blocking": median([s["blocking_seconds"] for s in saves]),
         "durable": durable, "durable_mib_s": _ratio(nbytes / MIB if nbytes else None, durable),
         "load_mib_s": restart.get("load_throughput_mib_s"),
         "storage_read_mib_s": storage_read.get("throughput_mib_s"), "lost": median(lost),
         "held_mib": held / MIB if held is not None else None, "held_x_rank": _ratio(held, rank),
         "reads_x": _ratio(storage_read.get("bytes"), nbytes),
         "x_fio_files": _ratio(summary.get("fio_files_seconds"), restart.get("load_seconds")),
         "digest": median([(s.get("training_lost") or {}).get("digest_seconds") for s in saves])}
    f.update({x: _ratio(f[figure], ceiling.get(f"{way}_mib_s")) for x, (figure, way) in _MIB_S.items()})
    grid = (ceiling.get("direct") or {}).get("grid") or []  # fio's shapes: the ceiling is their best
    for way, figure in (("write", "durable_mib_s"), ("read", "load_mib_s")):
        f[f"x_fio_{way}"] = _ratio(f[figure], max((g[f"{way}_mib_s"] or 0 for g in grid), default=None))
    runs = ceiling.get("spread") or {}
    f["ceiling_fastest"] = {w: (runs.get(f"{w}_mib_s") or [None, None])[1] for w in ("write", "read")}
    stats = restart.get("engine_load_statistics") or {}
    f["shared"] = any(x.get("way") != "read" for x in stats.get("replicated") or [])
    f["read_io"] = (stats.get("read_io") or {}).get("way")
    return f


def _row(summaries: list[dict], ceilings: list[dict], none_steps: list[float | None]) -> dict:
    """A case's per-repeat figures: each key a list over the repeats (each run against its own repeat's ceiling and
    engine=none's step)."""
    runs = [_run(s, c, none_steps[i] if i < len(none_steps) else None)
            for i, (s, c) in enumerate(zip(summaries, ceilings, strict=False)) if s]  # None: a run that failed
    return {k: [r[k] for r in runs] for k in runs[0]} if runs else {}


def cell(values: list[float | None], digits: int = 3) -> str:
    """median (min-max) over the repeats, or - where nothing was measured."""
    known = [v for v in values if v is not None]
    return spread(known, f",.{digits}f") if len(known) > 1 else f"{known[0]:,.{digits}f}" if known else "-"


def efficiency(values: list[float | None], why: str | None) -> str:
    """x ceiling over the repeats; above 1.0 never a plain figure: what explains it, or the ceiling flagged."""
    text = cell(values, 2)
    known = [v for v in values if v is not None]
    if not known or max(known) <= 1.0:
        return text
    return f"{text} **above 1: {why or 'CEILING NOT MEASURED RIGHT (no cache or overlap explains it)'}**"


def _why_above(r: dict, figure: str) -> str | None:
    """What can lift a figure over the storage's ceiling (docs/measurements.md#two-load-figures)."""
    if figure == "x_load" and any(r["shared"]):
        return "a replicated file's bytes counted once a rank that got them through shared memory or a broadcast"
    if figure == "x_load":
        return "reads ran on between the engine's loads (read-ahead no load second counts)"
    if figure == "x_storage_read" and "direct" not in r["read_io"]:
        return "a buffered reader's read-ahead between its calls (page cache)"
    return _within_ceiling_runs(r, figure) if figure in _MIB_S else None  # faster than fio on its own files: flagged


_MIB_S = {"x_write": ("durable_mib_s", "write"), "x_load": ("load_mib_s", "read"),
          "x_storage_read": ("storage_read_mib_s", "read")}


def _within_ceiling_runs(r: dict, figure: str) -> str | None:
    """Above the ceiling (the median of its best shape's runs) but not above that shape's fastest run, in every
    repeat where it is above 1: the storage did go that fast in the same repeat, its speed varying from run to run."""
    key, way = _MIB_S[figure]
    above = [(v, c[way]) for x, v, c in zip(r[figure], r[key], r["ceiling_fastest"]) if x is not None and x > 1.0]
    if not above or any(c is None or v > c for v, c in above):
        return None
    return (f"within the ceiling's own runs: its fastest {way} reached {max(c for _, c in above):,.0f} MiB/s "
            "(the storage's speed varies from run to run)")


COLUMNS = (("checkpoint MiB", "mib", 1), ("blocking s", "blocking", 3), ("durable s", "durable", 3),
           ("durable MiB/s", "durable_mib_s", 0), ("x ceiling write", "x_write", 2), ("load MiB/s", "load_mib_s", 0),
           ("x ceiling read (load)", "x_load", 2), ("storage read MiB/s", "storage_read_mib_s", 0),
           ("x ceiling read (storage)", "x_storage_read", 2), ("fio's read of the same files s / load s", "x_fio_files", 2),
           ("training lost per save s (vs none)", "lost", 3),
           ("host memory held MiB", "held_mib", 1), ("held x rank's checkpoint", "held_x_rank", 3),
           ("restart reads x checkpoint", "reads_x", 2))


RANKED = (("blocking", "blocking s", False), ("durable_mib_s", "durable MiB/s", True),
          ("load_mib_s", "load MiB/s", True), ("lost", "training lost per save s", False),
          ("held_mib", "host memory held MiB", False), ("reads_x", "restart reads x checkpoint", False))


def _ranking(rows: dict[str, dict]) -> None:
    """Each figure's engines, best first (medians; engine=none and rows without the figure left out)."""
    print("\nRanked, best first (medians):\n")
    for key, label, higher in RANKED:
        known = [(median(r[key]), n) for n, r in rows.items() if r and median(r[key]) is not None
                 and not n.endswith("none")]
        known.sort(key=lambda x: -x[0] if higher else x[0])
        if known:
            print(f"- {label}: " + (" > " if higher else " < ").join(f"{n} {v:,.3g}" for v, n in known))


def _grid_table(ceilings: list[dict], rows: dict[str, dict]) -> None:
    """The ceiling's probes: each fio shape's and the built-in probe's write and cold read (medians of 3 a repeat;
    here the median over the repeats); then each engine against fio's best shape alone."""
    grids = [(c.get("direct") or {}).get("grid") for c in ceilings]
    if not any(grids):
        refused = next(((c.get("direct") or {}).get("grid_refused") for c in ceilings if c.get("direct")), None)
        print(f"\nNo fio grid{': ' + refused if refused else ''}.")
        return
    print("\nThe ceiling's probes (MiB/s, the median over the repeats of each repeat's median of 3; O_DIRECT, fsync "
          "at the end of the writes, reads cold):\n\n| probe | write MiB/s | read MiB/s |\n|---|---|---|")
    for i, row in enumerate(next(g for g in grids if g)):
        shape = [g[i] for g in grids if g]
        print(f"| fio libaio {row['request_bytes'] // MIB} MiB x {row['queue_depth']} in flight x "
              f"{row['jobs_per_rank']} job(s) a rank | {cell([s['write_mib_s'] for s in shape], 0)} "
              f"| {cell([s['read_mib_s'] for s in shape], 0)} |")
    direct = [c["direct"] for c in ceilings if c.get("direct")]
    print(f"| built-in threads 16 MiB x 4 a rank | {cell([d['write_mib_s'] for d in direct], 0)} "
          f"| {cell([d['read_mib_s'] for d in direct], 0)} |")
    print(f"| the same read buffered | - | {cell([d.get('buffered_read_mib_s') for d in direct], 0)} |")
    print("\nAgainst fio's best shape alone (each repeat's; fio's buffers are malloc'ed 4 KiB pages, so its requests "
          "reach the device cut smaller than from the huge pages of the built-in probe and of engine=lazy: "
          "docs/benchmarks.md, nineteenth session): "
          + "; ".join(f"{n} durable {cell(r['x_fio_write'], 2)}, load {cell(r['x_fio_read'], 2)}"
                      for n, r in rows.items() if r and not n.endswith("none")) + ".")


def _reads(rows: dict[str, dict], collected: dict[str, list[dict]]) -> None:
    """How each engine that says so read at restart, and each replicated file's load (engine=lazy)."""
    stats = {n: [(s.get("restart") or {}).get("engine_load_statistics") or {} for s in collected[n] if s] for n in rows}
    print("\nHow the restarts read (restart.engine_load_statistics):\n")
    for name, st in stats.items():
        if said := sorted({f"{w['way']}: {w['why']}" + (f"; into {x['pages']['why']}" if x.get("pages") else "")
                           for x in st if (w := x.get("read_io"))}):
            print(f"- {name}: {'; '.join(said)}")
    for name, st in stats.items():
        for x in (r for stat in st for r in stat.get("replicated") or []):
            print(f"- {name}: {x['file']} {x['way']} in {x['seconds']:.3f} s ({x['why']})")


if __name__ == "__main__":
    main()
