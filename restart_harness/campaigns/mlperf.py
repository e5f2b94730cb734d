"""`./submit-job.sh mlperf WORKLOAD [runs=N] [checkpoints=N] [reads=N] [shrink=K] [run keys]`: an MLPerf Storage
v2.0 checkpoint workload through the harness (emulate=true: DeepSpeed's own files), MLPerf's metrics beside the
harness's own, into `<results_dir>/mlperf-<workload>-<time>/mlperf.json` (docs/mlperf.md)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from restart_harness import machine, resolve
from restart_harness.campaigns import outcome
from restart_harness.campaigns.sweep import fixed, new_dir
from restart_harness.command import parse
from restart_harness.errors import RunFailed, UsageError
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.phases import say
from restart_harness.phases.run import discard_checkpoint, restart_only
from restart_harness.phases.run import run as run_one
from restart_harness.plan import checkpoint
from restart_harness.plan import mlperf as workloads
from restart_harness.results import mlperf as metrics
from restart_harness.schema import GIB, MLPERF, MLPERF_SCHEMA_VERSION
from restart_harness.spec.model_shape import load_model


def sizes() -> list[dict]:
    """Each workload: its layout, stated size, 14 bytes per parameter of the preset's shape, and DeepSpeed's exact
    checkpoint (the planner's files for the workload's layout)."""
    rows = []
    for w in workloads.WORKLOADS.values():
        spec = parse.parse_run([w.preset, *w.layout_tokens])[0]
        files = checkpoint.stored_files(spec, resolve.plugins(spec).engine.files())
        params = spec.shape.num_parameters()
        exact = sum(f.bytes for f in files)
        rows.append({"workload": w.name, "preset": w.preset, "layout": f"{w.tp}x{w.pp}x{w.dp}", "zero": w.zero,
                     "ranks": w.ranks, "parameters": params, "stated": w.stated, "stated_bytes": w.stated_bytes,
                     "rule_bytes": params * workloads.BYTES_PER_PARAMETER, "deepspeed_bytes": exact,
                     "deepspeed_files": len(files), "why": workloads.WHY[w.zero]})
    return rows


def render_sizes(rows: list[dict]) -> str:
    lines = [("MLPerf Storage v2.0 checkpoint workloads (Submission_guidelines.md, Table 2) and DeepSpeed 0.19.8's "
             "checkpoint of each, from the planner"),
             (f"{'workload':<12} {'TPxPPxDP':>9} {'ZeRO':>4} {'ranks':>5} {'parameters':>17} {'stated':>8} "
             f"{'14 B/param':>12} {'DeepSpeed':>12} {'files':>6}")]
    for r in rows:
        lines.append(f"{r['workload']:<12} {r['layout']:>9} {r['zero']:>4} {r['ranks']:>5} {r['parameters']:>17,} "
                     f"{r['stated']:>8} {r['rule_bytes'] / GIB:>8.2f} GiB {r['deepspeed_bytes'] / GIB:>8.2f} GiB "
                     f"{r['deepspeed_files']:>6}")
    lines += ["",
              ("stated: MLPerf's Table 2; its 8B, 70B and 405B figures are 14 bytes per parameter of these shapes in "
               "GiB (bf16 weights, fp32 master weights, two fp32 Adam moments)."),
              *[f"{w}: {workloads.WHY[z]}." for w, z in (("ZeRO-3 (8b, 70b)", 3), ("ZeRO-1 (405b, 1t)", 1))],
              ("1t: Table 2's hidden size 25872 over 192 heads is no whole head dimension; the preset takes 134 "
               "(docs/planner.md). 14 bytes per parameter of the stated shape is 16.56e12 bytes, not 18 TB; "
               "counting the key and value projections as wide as the query's (no grouped-query attention) gives "
               "18.56e12."),
              "Run one, scaled down to this machine: ./submit-job.sh mlperf llama3-8b shrink=64 (docs/mlperf.md)"]
    return "\n".join(lines)


RULES = ("MLPerf Storage v2.0 (Submission_guidelines.md 2.2): duration = max over ranks, throughput = checkpoint "
         "size / that duration (the minimum over ranks), mean over a run's checkpoints, then over runs; "
         "GiB = 2^30 bytes (MLPerf's tool prints it as GB)")


def check(request) -> None:
    """What the mlperf command cannot do, before anything is created."""
    if request.options.runs > request.spec.max_runs:  # each run is a harness run, as a sweep's combinations are
        raise UsageError(f"runs={request.options.runs}: more runs than max_runs={request.spec.max_runs}; accepted: "
                         "runs up to max_runs (raise max_runs= for more)")
    if request.plugins.launcher.submits():
        raise UsageError(f"launcher={request.spec.launcher}: mlperf runs its runs and reads one after another "
                         "where it is started; accepted: inside an allocation (salloc / qsub -I), or "
                         "launcher=local|torchrun")


def run(request) -> Path:
    """Every run, then its reads; mlperf.json rewritten after each. Returns the folder."""
    spec, options, w = request.spec, request.options, request.workload
    folder = new_dir(spec.results_dir, f"mlperf-{w.name}")
    record = {
        "schema_version": MLPERF_SCHEMA_VERSION, "command": ["mlperf", w.name, *request.tokens],
        "state": "running", "started": time.time(), "finished": None,
        "workload": w.name, "preset": w.preset, "ranks": w.ranks, "tp": w.tp, "pp": w.pp, "dp": w.dp, "zero": w.zero,
        "stated_checkpoint": w.stated, "scaled_down": spec.shrink > 1, "shrink": spec.shrink, "subset": spec.subset,
        "launched_ranks": spec.launched_ranks, "parameters": spec.shape.num_parameters(),
        "workload_parameters": load_model(w.preset)[0].num_parameters(), "runs": options.runs,
        "checkpoints": options.checkpoints, "reads": options.reads, "emulated": True, "engine": spec.engine,
        "fsync": "every file, before the checkpoint counts as written",
        "cache": "dropped before every read (each read a restart in fresh processes)",
        "rules": RULES, "run_dirs": [], "per_run": [], "overall": None}
    write_json_atomic(folder / MLPERF, record)
    scaled = f", SCALED DOWN shrink={spec.shrink}" if spec.shrink > 1 else ""
    subset = f" (subset: the first {spec.launched_ranks} here)" if spec.subset else ""
    say(f"mlperf {w.name}{scaled}: {options.runs} run(s) x ({options.checkpoints} checkpoint writes, "
        f"{options.reads} cold reads), {w.ranks} ranks{subset} TPxPPxDP {w.tp}x{w.pp}x{w.dp} "
        f"ZeRO-{w.zero}, emulated; into {folder}")
    try:
        for n in range(1, options.runs + 1):
            say(f"[mlperf run {n}/{options.runs}]")
            one = dataclasses.replace(spec, results_dir=str(folder), keep=True)
            run_dir = run_one(request.plugins.with_spec(one), prefix=f"{n:02d}-")
            record["run_dirs"].append(str(run_dir))
            write_json_atomic(folder / MLPERF, record)
            if options.reads > 1:
                restarts = machine.complete_in_job(dataclasses.replace(one, phase="restart", repeats=options.reads - 1))
                restart_only(parse.RestartRequest(resolve.read(run_dir, spec=restarts), one, []))
            if not spec.keep:
                discard_checkpoint(resolve.read(run_dir))
            record["per_run"].append(metrics.run_metrics(read_json(run_dir / "summary.json")))
            record["overall"] = metrics.overall(record["per_run"])
            write_json_atomic(folder / MLPERF, record)
        record["state"] = "complete"
    except (RunFailed, KeyboardInterrupt) as exc:
        record["state"], record["reason"] = "failed", str(exc) or type(exc).__name__
        raise
    finally:
        record["finished"] = time.time()
        write_json_atomic(folder / MLPERF, record)
    return folder


def render(record: dict) -> str:
    """MLPerf's four figures (mean over runs, with min-max), then the harness's own per run."""
    o = record["overall"] or {}
    scale = (f"SCALED DOWN: shrink={record['shrink']}, {record['parameters']:,} parameters instead of the "
             f"workload's {record['workload_parameters']:,}; the layout, ranks, files and ZeRO stage are the "
             "workload's" if record["scaled_down"] else
             f"full size: {record['parameters']:,} parameters")
    lines = [(f"mlperf {record['workload']} ({record['preset']}): {record['ranks']} ranks, TPxPPxDP "
             f"{record['tp']}x{record['pp']}x{record['dp']}, ZeRO-{record['zero']}, emulated (DeepSpeed's files)"),
             f"  {scale}"]
    if record.get("subset"):
        lines.append(f"  SUBSET (MLPerf's subset mode): ranks 0-{record['launched_ranks'] - 1} of {record['ranks']} "
                     "ran on this host, writing and reading their own files of the checkpoint only")
    lines += [(f"  {o.get('runs', 0)} run(s) of {record['checkpoints']} writes and {record['reads']} cold reads; "
               f"state {record['state']}"), "",
              f"{'MLPerf metric (mean over runs)':<34} {'mean':>10} {'min':>10} {'max':>10}"]
    for name, label in (("save_duration_seconds", "checkpoint save duration (s)"),
                        ("save_throughput_gib_s", "checkpoint save throughput (GiB/s)"),
                        ("load_duration_seconds", "checkpoint load duration (s)"),
                        ("load_throughput_gib_s", "checkpoint load throughput (GiB/s)")):
        lines.append(f"{label:<34} {fixed(o.get(name)):>10} {fixed(o.get(name + '_min')):>10} "
                     f"{fixed(o.get(name + '_max')):>10}")
    lines += ["", "per run (harness figures: medians over the run's saves and restarts)",
              (f"{'run':<4} {'checkpoint':>12} {'save s':>8} {'GiB/s':>8} {'load s':>8} {'GiB/s':>8} "
              f"{'blocking':>9} {'durable':>8} {'commit':>8} {'restart':>8}  cache")]
    for i, r in enumerate(record["per_run"], 1):
        h = r["harness"]
        size = r["writes"][-1]["bytes"] / GIB if r["writes"] else None
        lines.append(f"{i:<4} {fixed(size, 4):>8} GiB {fixed(r['save_duration_seconds']):>8} "
                     f"{fixed(r['save_throughput_gib_s']):>8} {fixed(r['load_duration_seconds']):>8} "
                     f"{fixed(r['load_throughput_gib_s']):>8} {fixed(h['save_blocking_seconds_median']):>9} "
                     f"{fixed(h['save_durable_seconds_median']):>8} {fixed(h['save_commit_seconds_median']):>8} "
                     f"{fixed(h['restart_total_seconds_median']):>8}  {','.join(h['cache_observed']) or '-'}")
    lines += ["", (f"definitions: {record['rules']}; save = until every file is fsync'd (durable), load = inside "
                  "the engine's load calls; harness restart = process start to checkpoint loaded (docs/mlperf.md)")]
    return "\n".join(lines)


def main(request) -> int:
    """The command: the workloads' table without a workload; else run it and print the figures."""
    if request.workload is None:
        print(render_sizes(sizes()))
        return 0
    folder = run(request)
    print(render(read_json(folder / MLPERF)))
    print(folder)
    return outcome.exit_code([read_json(folder / MLPERF)["state"]])
