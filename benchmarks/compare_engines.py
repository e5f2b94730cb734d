#!/usr/bin/env python3
"""Checkpoint engines side by side (named compare_engines.py: a script named engines.py would shadow the engines
package) on the `small` preset: median blocking and durable save seconds, throughput.

Method
- Engines: every engine whose plug-in accepts this machine (check() passes: on CPU default, torchsnapshot and
  its async_take variant, dcp and its async_save variant, lazy, and fastpersist where libaio's headers are; on CUDA
  also datastates where installed and decoupled), plus engine=none for the step-time baseline.
- Each case is one `./submit-job.sh small dp=2 engine=... iters=6 save_interval=2 after=1 cache=drop keep=false`
  (override the layout and counts with extra key=value arguments; keep=false deletes the checkpoint once the run's
  records are written), run REPEATS times in sequence on an otherwise idle
  machine, cases interleaved per repeat so drift hits all engines alike.
- Per run: for each save, the slowest rank's blocking_seconds (inside save_checkpoint) and durable_seconds (until
  the flush finished and every file is fsync'd), from summary.json; the first save of a run is dropped as warm-up
  when there are more. Per case: medians over all kept saves of all repeats; throughput_mib_s is checkpoint
  bytes / median seconds (2^20 bytes per MiB; MLPerf Storage's bytes over the slowest rank).
- Step seconds: the median training step with and without a flush in flight (rank 0), medians over repeats, to
  show what overlapping a flush costs the training loop; restart load seconds and load MiB/s (checkpoint bytes read
  by all ranks / checkpoint_load seconds) are reported too.
- Training time lost per save (docs/measurements.md#training-lost): each save's window (the end of its step to the
  next save) less the steps it holds at the run's own baseline step (`lost s (own)`), and the same window less those
  steps at engine=none's median step of the same repeat (`lost s (vs none)`: the step with no checkpointing at all);
  medians over the kept saves of all repeats.
- Memory per save (docs/measurements.md#memory-per-save): each run's summary.checkpoint.memory, medians over
  repeats; the growth per save needs 5 saves or more (iters >= 10 at save_interval=2), else it is left empty.
  Beside it, what each restart read from storage (all ranks, the I/O counters' load_breakdown.storage_read.bytes)
  over the checkpoint's bytes: a byte count, exact in one repeat (engine=lazy's broadcast load against
  `lazy every replica reads`).
- Stacks: the `fsdp2 ...` cases train the same model on the same samples with stack=fsdp2 (docs/fsdp2.md); their
  checkpoint is 12 bytes per parameter (fp32 weights and two moments) against DeepSpeed's 14 (a bf16 model copy
  besides), so compare them in MiB/s, not in seconds. `only=LABEL,LABEL` runs the named cases alone.
- Storage: in each repeat, before its engines, `./submit-job.sh baseline` measures the results directory's file
  system afresh with as many ranks as the run has (write: each rank writes BASELINE_FILE_MIB and fsyncs; read: cold),
  and its ceiling in the same command, interleaved with the baseline's probes (docs/measurements.md#storage-ceiling:
  per direction the better of O_DIRECT with engine=lazy's 16 MiB requests, 4 in flight a rank, fsync at the end, and
  the baseline). Ratios: blocking / default's blocking; durable MiB/s / baseline write MiB/s and / ceiling write
  MiB/s; load MiB/s / baseline read MiB/s and / ceiling read MiB/s. The ceiling ratios are taken per repeat (each
  run's durable and load MiB/s over its own repeat's ceiling), then their median and min-max over the repeats.
- The restart's reads: beside load MiB/s (what the restart waited for), the storage read MiB/s (all ranks' bytes
  read from storage over the slowest rank's seconds with a read in flight: load_breakdown.storage_read), both over
  the repeat's read ceiling, and how each engine that says so read (engine_load_statistics.read_io). A load above
  the ceiling is reads running on between the engine's loads, not a storage faster than its ceiling
  (docs/measurements.md#two-load-figures).
- Machine load: the 1-minute load average before and after each repeat, and each run's own record of other work
  on the CPUs just before its launch (summary.checkpoint.machine_load.cpu_busy_fraction), in the table's header.
- Targets: `targets=fs,s3` runs every case that can write to object storage (engine default and dcp, both stacks)
  a second time with ckpt_dir=s3://bench/runs on a local Ceph RADOS Gateway that the script starts (objects in
  memory, testbeds/ceph_s3.py) and stops; those rows are labelled `... s3` (keep=false matters there too: the
  store's memory is bounded), and their ratios are to the S3 baseline (`./submit-job.sh baseline
  dir=s3://bench/probe`: PUT and GET with the engines' own client), measured in each repeat beside the disk's. The
  restart phases and the load and save anatomy (median seconds of the slowest rank) show where the time goes.

Usage: <python> -m benchmarks.compare_engines [REPEATS] [MODEL] [only=LABEL,...] [targets=fs,s3] [key=value ...]
       (default 3 small dp=2, every case that runs here, on the file system; a Markdown table)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.common import median, spread, submitted

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
    ("lazy O_DIRECT reads", ["engine=lazy", "read_io=direct"]),  # reads O_DIRECT whatever the probe found faster
    ("lazy every replica reads", ["engine=lazy", "broadcast_load=false"]),  # without the shared or broadcast load
    # always the broadcast load (auto: shared memory where the replicas share a node, else the measured choice)
    ("lazy broadcast", ["engine=lazy", "broadcast_load=true"]),
    # the PyTorch-native stack: the same model and data, FSDP2 sharding, one collective DCP save per checkpoint
    ("fsdp2 none", ["stack=fsdp2", "engine=none"]),
    ("fsdp2 dcp", ["stack=fsdp2", "engine=dcp"]),
    ("fsdp2 dcp async_save", ["stack=fsdp2", "engine=dcp", "async_save=true"]),
]
# keep=false: each run's checkpoint is deleted once its records are written (3 repeats of 4 `small` cases at
# iters=10 kept 39 GB otherwise, more than this project's disk had free on 2026-11-27)
BASE = ["dp=2", "iters=6", "save_interval=2", "after=1", "cache=drop", "keep=false"]
BASELINE_FILE_MIB = 256


def runnable(tokens: list[str]) -> bool:
    from restart_harness import machine, resolve
    from restart_harness.command import parse_args
    from restart_harness.errors import UsageError

    try:
        spec = machine.resolve(parse_args(tokens))
        resolve.plugins(spec).engine.check()  # the engine's own check: e.g. CUDA-only engines on a CPU machine
        return True
    except UsageError as exc:
        print(f"skipped {' '.join(tokens)}: {exc}", file=sys.stderr)
        return False


def run(tokens: list[str], results: Path) -> dict:
    run_dir = submitted([*tokens, f"results_dir={results}"])
    return json.loads((run_dir / "summary.json").read_text())


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def baseline(results: Path | str, ranks: int) -> dict:
    """A fresh storage baseline of the results directory (or an s3:// URL), its ceiling with it: the record the
    command cached (its last line: `measured_at ...; cached in PATH.json (whose cache)`)."""
    said = str(submitted(["baseline", f"dir={results}", f"ranks={ranks}", f"file_bytes={BASELINE_FILE_MIB}MiB"]))
    return json.loads(Path(said.rsplit("cached in ", 1)[1].rsplit(".json", 1)[0] + ".json").read_text())


def main() -> None:
    args = sys.argv[1:]
    repeats = int(args.pop(0)) if args and args[0].isdigit() else 3
    model = args.pop(0) if args and "=" not in args[0] else "small"
    only = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("only=")), None)
    targets = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("targets=")), ["fs"])
    args = [a for a in args if not a.startswith(("only=", "targets="))]
    if set(targets) - {"fs", "s3"}:
        sys.exit(f"targets={','.join(targets)}: accepted fs, s3 (comma list)")
    unknown = set(only or ()) - {name for name, _ in CASES}
    if unknown:
        sys.exit(f"only=: unknown case(s) {', '.join(sorted(unknown))}; cases: {', '.join(n for n, _ in CASES)}")
    given = {a.split("=", 1)[0] for a in args}
    base = [model, *(b for b in BASE if b.split("=", 1)[0] not in given), *args]
    chosen = [(name, extra) for name, extra in CASES if only is None or name in only]
    cases = [(name, base + extra) for name, extra in chosen if "fs" in targets and runnable(base + extra)]
    server = None
    if "s3" in targets:
        server = start_object_store()
        cases += [(f"{name} s3", [*base, *extra, S3_TARGET]) for name, extra in chosen
                  if runnable([*base, *extra, S3_TARGET])]
    try:
        measure(cases, base, repeats, targets)
    finally:
        if server is not None:
            from testbeds import ceph_s3

            ceph_s3.stop(server.root)


S3_TARGET = "ckpt_dir=s3://bench/runs"


def start_object_store():
    """A local RADOS Gateway for the s3 rows; its AWS_* settings go to every run through the environment."""
    from testbeds import ceph_s3

    server = ceph_s3.start(Path(f"/tmp/rh-bench-s3-{os.getpid()}"), memory_mib=6144)
    server.create_bucket("bench")
    os.environ.update(server.environment())
    return server


def measure(cases: list[tuple[str, list[str]]], base: list[str], repeats: int, targets: list[str]) -> None:
    from restart_harness.command import parse_args

    world = parse_args(base).world_size
    results = Path(tempfile.mkdtemp(prefix="rh-bench-engines-"))
    collected: dict[str, list[dict]] = {name: [] for name, _ in cases}
    storage: dict[str, list[dict]] = {t: [] for t in targets}
    loads = []  # the 1-minute load average before and after each repeat
    for r in range(repeats):
        loads.append(os.getloadavg()[0])
        for target in targets:
            storage[target].append(baseline(results if target == "fs" else "s3://bench/probe", world))
        for name, tokens in cases:
            print(f"repeat {r + 1}/{repeats}: {name}", file=sys.stderr, flush=True)
            collected[name].append(run(tokens, results))
        loads.append(os.getloadavg()[0])
    speeds = {t: (median([b["write_mib_s"] for b in storage[t]]), median([b["read_mib_s"] for b in storage[t]]))
              for t in targets}
    ceilings = {t: [b.get("ceiling") or {} for b in storage[t]] for t in targets}
    _print_header(base, repeats, world, speeds, ceilings, loads, collected)
    # engine=none's step per repeat: the step with no checkpointing at all, which each repeat's saves are held to
    none_steps = [summary["training"]["step_seconds_median"] for summary in collected.get("none", [])]
    rows = {name: _row(collected[name], ceilings["s3" if name.endswith(" s3") else "fs"], none_steps)
            for name, _ in cases}
    _main_table(rows, speeds)
    _anatomy_table(rows)
    _memory_table(rows)
    _reads_table(rows)
    replicated = [(name, x) for name, _ in cases for s in collected[name]
                  for x in ((s["restart"] or {}).get("engine_load_statistics") or {}).get("replicated") or []]
    if replicated:
        print("\nHow each restart loaded a replicated file (engine=lazy: restart.engine_load_statistics.replicated), "
              "one line per restart in repeat order:\n")
        for name, x in replicated:
            print(f"- {name}: {x['file']} {x['way']} in {x['seconds']:.3f} s ({x['why']})")
    shutil.rmtree(results, ignore_errors=True)


def _print_header(base: list[str], repeats: int, world: int, speeds: dict, ceilings: dict, loads: list[float],
                  collected: dict[str, list[dict]]) -> None:
    """What was run, the storage's baselines and ceilings, and how busy the machine was."""
    busy = [((s["checkpoint"].get("machine_load") or {}).get("cpu_busy_fraction")) for runs in collected.values()
            for s in runs]
    busy = [b for b in busy if b is not None]
    print(f"`{' '.join(base)}`, {repeats} repeats; medians over saves (first save of each run dropped) and runs; "
          f"storage baselines ({world} ranks, {BASELINE_FILE_MIB} MiB each, measured in each repeat): "
          + "; ".join(f"{'file system' if t == 'fs' else 'local S3 (RGW)'} write {w:.1f} MiB/s, "
                      f"{'cold ' if t == 'fs' else ''}read {rd:.1f} MiB/s" for t, (w, rd) in speeds.items())
          + "; ceilings, measured with them: "
          + "; ".join(f"{'file system' if t == 'fs' else 'local S3 (RGW)'} " + _ceiling_words(ceilings[t])
                      for t in ceilings)
          + f". Machine: 1-minute load average {min(loads):.1f}-{max(loads):.1f} over the repeats"
          + (f", other work on the CPUs before a launch {median(busy):.0%} (median; "
             f"{min(busy):.0%}-{max(busy):.0%})" if busy else "") + ".\n")


def _kept(summary: dict) -> list[dict]:
    """A run's saves less the first (warm-up) where there are more."""
    return summary["checkpoint"]["saves"][1:] or summary["checkpoint"]["saves"]


def _medians(records: list[dict | None], keys: tuple[str, ...], suffix: str = "") -> dict:
    return {k: median([(r or {}).get(f"{k}{suffix}") for r in records]) for k in keys}


def _row(summaries: list[dict], ceilings: list[dict], none_steps: list[float | None]) -> dict:
    """One case's figures: medians over its kept saves and its repeats' runs."""
    saves = [s for summary in summaries for s in _kept(summary)]
    nbytes = median([s["bytes"] for s in saves])
    training = [summary["training"] for summary in summaries]
    restarts = [summary["restart"] or {} for summary in summaries]
    memory = [summary["checkpoint"].get("memory") or {} for summary in summaries]
    pairs = list(zip(summaries, ceilings, strict=False))  # each repeat's run and its repeat's ceiling
    lost_own, lost_none = [], []  # training lost per kept save: at the run's own step, and at engine=none's
    for i, summary in enumerate(summaries):
        for s in _kept(summary):
            tl = s.get("training_lost") or {}
            lost_own.append(tl.get("seconds"))
            if tl.get("window_seconds") is not None and i < len(none_steps) and none_steps[i] is not None:
                lost_none.append(tl["window_seconds"] - tl["steps_in_window"] * none_steps[i])
    return {
        "lost_own": median(lost_own), "lost_none": median(lost_none),
        "mib": nbytes / 2**20 if nbytes else None,
        "blocking": median([s["blocking_seconds"] for s in saves]), "durable": median([s["durable_seconds"] for s in saves]),
        "no_flush": median([t.get("step_seconds_median_no_flush", t["step_seconds_median"]) for t in training]),
        "in_flight": median([t.get("step_seconds_median_in_flight") for t in training]),
        "load": median([r.get("load_seconds") for r in restarts]),
        "load_mib_s": median([r.get("load_throughput_mib_s") for r in restarts]),
        "phases": _medians([r.get("phases") for r in restarts], PHASES),
        "save_anatomy": _medians([s.get("breakdown") for s in saves], SAVE_PARTS, "_seconds"),
        "load_anatomy": _medians([r.get("load_breakdown") for r in restarts], LOAD_PARTS, "_seconds"),
        "memory": _medians(memory, MEMORY),
        "growth": median([(m.get("growth") or {}).get("bytes_per_save") for m in memory]),
        "step_growth": median([((t.get("rss_growth") or {}).get("bytes_per_step")) for t in training]),
        "storage_read": median([_storage_read(r).get("bytes") for r in restarts]),
        "rank_bytes": median([(s["checkpoint"].get("bytes_per_rank") or {}).get("max") for s in summaries]),
        "storage_read_mib_s": median([_storage_read(r).get("throughput_mib_s") for r in restarts]),
        "read_ways": sorted({f"{w['way']}: {w['why']}" for r in restarts
                             for w in [((r.get("engine_load_statistics") or {}).get("read_io"))] if w}),
        # each repeat's run against its own repeat's ceiling: durable MiB/s (median of its kept saves) and load
        "of_ceiling": {"write": [_ratio(_durable_mib_s(s), c.get("write_mib_s")) for s, c in pairs],
                       "read": [_ratio((s["restart"] or {}).get("load_throughput_mib_s"), c.get("read_mib_s"))
                                for s, c in pairs],
                       "storage_read": [_ratio(_storage_read(s["restart"]).get("throughput_mib_s"), c.get("read_mib_s"))
                                        for s, c in pairs]},
    }


PHASES = ("imports", "dist_init", "model_build", "engine_init", "checkpoint_load", "first_step")
SAVE_PARTS = ("serialize", "write", "fsync", "wait")
LOAD_PARTS = ("read", "deserialize", "copy", "wait")
MEMORY = ("peak_added_bytes_max", "held_bytes_max", "cost_bytes_median", "engine_buffers_bytes_max",
          "step_peak_added_bytes")


def _head(*columns: str) -> None:
    """A Markdown table's header and its separator."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def _main_table(rows: dict[str, dict], speeds: dict) -> None:
    _head("engine", "checkpoint MiB", "blocking s", "x default", "durable s", "durable MiB/s", "x baseline write",
          "x ceiling write", "step s (no flush)", "step s (flush in flight)", "restart load s", "load MiB/s",
          "x baseline read", "x ceiling read", "checkpoint_load s", "lost s (own)", "lost s (vs none)")
    default_blocking = (rows.get("default") or {}).get("blocking")
    for name, r in rows.items():
        write_mib_s, read_mib_s = speeds["s3" if name.endswith(" s3") else "fs"]
        mib, blocking, durable = r["mib"], r["blocking"], r["durable"]
        durable_mib_s = mib / durable if mib and durable else None
        print(f"| {name} | {fmt(mib, 1)} | {fmt(blocking)} "
              f"| {fmt(blocking / default_blocking if blocking is not None and default_blocking else None, 3)} "
              f"| {fmt(durable)} | {fmt(durable_mib_s, 1)} "
              f"| {fmt(durable_mib_s / write_mib_s if durable_mib_s else None, 2)} | {spread(r['of_ceiling']['write'])} "
              f"| {fmt(r['no_flush'])} | {fmt(r['in_flight'])} | {fmt(r['load'])} | {fmt(r['load_mib_s'], 1)} "
              f"| {fmt(r['load_mib_s'] / read_mib_s if r['load_mib_s'] else None, 2)} "
              f"| {spread(r['of_ceiling']['read'])} | {fmt(r['phases']['checkpoint_load'])} "
              f"| {fmt(r['lost_own'])} | {fmt(r['lost_none'])} |")


def _anatomy_table(rows: dict[str, dict]) -> None:
    print("\nWhere the time goes (medians; slowest rank's anatomy, docs/anatomy.md): restart phases in seconds, then "
          "one save's and the load's categories.\n")
    _head("engine", *PHASES, *(f"save: {p}" if i == 0 else p for i, p in enumerate(SAVE_PARTS)),
          *(f"load: {p}" if i == 0 else p for i, p in enumerate(LOAD_PARTS)))
    for name, r in rows.items():
        cells = [*r["phases"].values(), *r["save_anatomy"].values(), *r["load_anatomy"].values()]
        print(f"| {name} | " + " | ".join(fmt(c) for c in cells) + " |")


def _memory_table(rows: dict[str, dict]) -> None:
    print("\nHost memory a save costs a rank (MiB, medians over repeats; docs/measurements.md#memory-per-save): its peak "
          "over the RSS it starts with (most demanding save), held while its flush runs, the median save's cost beyond "
          "a training step's own, the buffers the engine keeps between saves, the RSS growth per save and per step "
          "(summary.training.rss_growth: engine=none's is training's own); then what "
          "the restart read from storage, all ranks (MiB, the I/O counters), and that over the checkpoint's bytes; "
          "last, the held memory and the engine's buffers over the largest rank's checkpoint bytes (what it wrote).\n")
    _head("engine", "peak", "held", "cost", "engine buffers", "a step's own", "growth per save", "growth per step",
          "restart storage reads", "x checkpoint", "rank's checkpoint", "held x rank's", "buffers x rank's")
    for name, r in rows.items():
        m = r["memory"]
        cells = [*m.values(), r["growth"], r["step_growth"], r["storage_read"]]
        ratio = r["storage_read"] / 2**20 / r["mib"] if r["storage_read"] and r["mib"] else None
        print(f"| {name} | " + " | ".join(fmt(c / 2**20 if c is not None else None, 1) for c in cells)
              + f" | {fmt(ratio, 2)} | {fmt(r['rank_bytes'] / 2**20 if r['rank_bytes'] else None, 1)} "
              f"| {fmt(_ratio(m['held_bytes_max'], r['rank_bytes']), 3)} "
              f"| {fmt(_ratio(m['engine_buffers_bytes_max'], r['rank_bytes']), 3)} |")


def _reads_table(rows: dict[str, dict]) -> None:
    print("\nThe restart's reads against the storage (medians over repeats; docs/measurements.md#two-load-figures): "
          "load MiB/s is the checkpoint's bytes over the seconds the slowest rank waited inside the engine's loads; "
          "storage read MiB/s is what all ranks read from storage over the slowest rank's seconds with a read in "
          "flight, the storage's own pace. A load above the storage read (or above the ceiling) means reads ran on "
          "while DeepSpeed worked between the engine's loads (a read-ahead), which no load second counts, not a "
          "storage faster than its ceiling. A storage read above the ceiling is a buffered reader working between "
          "its calls (torch.load), whose pages the kernel read ahead while no call was in flight "
          "(benchmarks/read_ahead_overlap.py).\n")
    _head("engine", "load MiB/s", "x ceiling read", "storage read MiB/s", "x ceiling read", "how it read")
    for name, r in rows.items():
        if r["load_mib_s"] is None:
            continue
        print(f"| {name} | {fmt(r['load_mib_s'], 1)} | {spread(r['of_ceiling']['read'])} "
              f"| {fmt(r['storage_read_mib_s'], 1)} | {spread(r['of_ceiling']['storage_read'])} "
              f"| {'; '.join(r['read_ways']) or '-'} |")


def _storage_read(restart: dict | None) -> dict:
    """A restart's storage read (results/breakdown.py): bytes read by all ranks over the slowest rank's read busy."""
    return ((restart or {}).get("load_breakdown") or {}).get("storage_read") or {}


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def _durable_mib_s(summary: dict) -> float | None:
    """A run's durable MiB/s: checkpoint bytes over the median durable seconds of its kept saves."""
    saves = _kept(summary)
    seconds, nbytes = median([s["durable_seconds"] for s in saves]), median([s["bytes"] for s in saves])
    return nbytes / 2**20 / seconds if seconds and nbytes else None


def _ceiling_words(ceilings: list[dict]) -> str:
    """The repeats' ceilings in words: median write and read, min-max, and where each came from."""
    if not any(ceilings):
        return "none (object storage)"
    out = []
    for way in ("write", "read"):
        values = [c[f"{way}_mib_s"] for c in ceilings if c]
        sources = sorted({c[f"{way}_from"] for c in ceilings if c})
        out.append(f"{way} {median(values):.1f} MiB/s ({min(values):.0f}-{max(values):.0f}; from "
                   f"{' and '.join(sources)})")
    d = next(c["direct"] for c in ceilings if c)
    return ", ".join(out) + (f" [direct probe: {d['method']}, {'O_DIRECT' if d['o_direct'] else 'buffered'}, "
                             f"{d['request_bytes'] >> 20} MiB x {d['queue_depth']} a rank]")


if __name__ == "__main__":
    main()
