"""The command line -> one validated request (command/requests.py): which command the words name (older spellings
too), and the parsers of plan, predict, restart (at its own layout or another), matrix, mlperf and the options-only
commands. Pure: reads only the files the command names, never checks or changes the machine (preflight.py)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection
from pathlib import Path as FsPath

from engines import registry
from restart_harness import resolve, stacks
from restart_harness.command.options import (
    MATRIX_STACK_CASES,
    MLPERF_FIXED,
    BaselineOptions,
    CalibrateOptions,
    CleanOptions,
    MatrixOptions,
    MlperfOptions,
    PlanOptions,
    PredictOptions,
    RestartOptions,
)
from restart_harness.command.requests import (
    MlperfRequest,
    PlanRequest,
    PredictRequest,
    RestartRequest,
    Strategy,
    StudyRequest,
)
from restart_harness.command.run import COMMANDS, is_sweep, parse_run, parse_sweep, unknown
from restart_harness.command.study import parse_study
from restart_harness.command.tokens import fill, options_of, pairs_of, required
from restart_harness.errors import UsageError, refused
from restart_harness.files.fsfacts import why_unresolvable
from restart_harness.spec import record as records
from restart_harness.spec.keys import Key, coerce, keys_of, parse_bool
from restart_harness.spec.model_shape import load_model, preset_names, shape_keys
from restart_harness.spec.runspec import RunSpec, plausible_rates, run_keys

# what the other modules and cli.py ask of this one by name (study and sweeps parse in their own modules)
__all__ = ["Strategy", "StudyRequest", "is_sweep", "parse_study", "parse_sweep", "preset_names"]


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """(command, its tokens). The command word is optional (run); the older spellings map onto commands."""
    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if "phase=restart" in argv:
        return "restart", [t for t in argv if t != "phase=restart"]
    if plan := next((t for t in argv if t.startswith("plan=")), None):
        value = plan.split("=", 1)[1].lower()
        if value == "json":
            return "plan", [t if t != plan else "plan=json" for t in argv]
        try:
            wanted = parse_bool("plan", value)
        except UsageError:
            raise UsageError(f"{plan}: accepted values are true, json, false (also 1, 0, yes, no, on, off)") from None
        rest = [t for t in argv if t != plan]
        return ("plan", rest) if wanted else ("run", rest)
    return "run", argv


def parse_options(command: str, tokens: list[str]):
    """calibrate, clean, baseline: the command's own keys only."""
    return options_of({"calibrate": CalibrateOptions, "clean": CleanOptions, "baseline": BaselineOptions}[command],
                      tokens, command)


def parse_matrix(tokens: list[str]) -> MatrixOptions:
    options = options_of(MatrixOptions, tokens, "matrix")
    for name in ("engines", "layouts"):
        values = getattr(options, name).split(",")
        if twice := next((v for i, v in enumerate(values) if v in values[:i]), None):
            raise UsageError(f"{name}={getattr(options, name)}: {twice!r} given twice; accepted: each once")
    if options.model is not None:
        load_model(options.model)  # an unknown preset: one line naming the accepted ones
    for layout in ([] if options.layouts == "auto" else options.layouts.split(",")):
        if not re.fullmatch(r"tp[1-9][0-9]*-pp[1-9][0-9]*-dp[1-9][0-9]*", layout):
            raise UsageError(f"layouts={options.layouts}: {layout!r} is not a layout; accepted: tpT-ppP-dpD, "
                             "e.g. tp2-pp2-dp1, comma-separated, or auto")
    resolve.launcher_class(options.launcher)  # an unknown one: one line naming the accepted ones
    if options.engines != "all":
        for name in options.engines.split(","):
            if name not in registry.names() and name not in MATRIX_STACK_CASES:
                raise UsageError(f"engines={options.engines}: unknown engine {name!r}; accepted: "
                                 f"{', '.join([*registry.names(), *MATRIX_STACK_CASES])}, or all")
    return options


def parse_mlperf(tokens: list[str]) -> MlperfRequest:
    """`mlperf [WORKLOAD] [runs=N] [checkpoints=N] [reads=N] [run keys ...]`: the workload's preset, layout and ZeRO
    stage, emulated (DeepSpeed's own files without GPUs), `checkpoints` saves and a cold read per restart."""
    from restart_harness.plan import mlperf

    if not tokens:
        return MlperfRequest(None, MlperfOptions(), None, [])
    name, *rest = tokens
    if "=" in name:
        raise UsageError(f"{name!r}: the first argument of mlperf must be a workload; accepted: "
                         f"{', '.join(mlperf.WORKLOADS)} (or none: the table of workloads)")
    workload = mlperf.get(name)
    pairs = pairs_of(rest)
    if "dry_run" in pairs:
        raise refused("dry_run", pairs["dry_run"], "not taken by mlperf; `./submit-job.sh mlperf` (no workload) prints "
                      f"the workloads, `./submit-job.sh plan {workload.preset} {' '.join(workload.layout_tokens)}` "
                      "the files of one checkpoint")
    fixed = [k for k in pairs if k in MLPERF_FIXED or k in shape_keys()]
    if fixed:
        raise refused(fixed[0], pairs[fixed[0]], f"fixed by the MLPerf workload {workload.name} ({workload.preset}, "
                      f"TPxPPxDP {workload.tp}x{workload.pp}x{workload.dp}, ZeRO-{workload.zero}, emulated, every "
                      "checkpoint fsync'd, cold reads); scale it down with shrink=K")
    checkpoints = fill(keys_of(MlperfOptions), pairs)[0].get("checkpoints", MlperfOptions.checkpoints)
    declared = run_keys()
    if "subset" in pairs and coerce(declared["subset"], pairs["subset"]):  # MLPerf's subset: one host of 8 GPUs
        per_node = coerce(declared["ranks_per_node"], pairs.setdefault("ranks_per_node", "8"))
        pairs.setdefault("nodes", str(max(1, workload.ranks // per_node)))
    pairs.setdefault("keep", "false")  # each run's checkpoints deleted after its reads, as MLPerf's tool reuses its
    spec, values = parse_run([workload.preset, *workload.layout_tokens, "emulate=true", "engine=default",
                              "cache=drop", f"iters={checkpoints}", "save_interval=1",
                              *(f"{k}={v}" for k, v in pairs.items())], keys_of(MlperfOptions))
    return MlperfRequest(workload, MlperfOptions(**values), spec, rest)


# ---- plan, predict ---------------------------------------------------------------------------------------------
def parse_plan(tokens: list[str]) -> PlanRequest:
    spec, values = parse_run(tokens, keys_of(PlanOptions))
    if not resolve.stack_class(spec).planned:
        raise UsageError(f"stack={spec.stack}: the planner predicts DeepSpeed's checkpoint files; accepted: "
                         f"{_planned_stacks()} (a "
                         f"stack={spec.stack} checkpoint is one DCP shard file per rank and .metadata)")
    options = PlanOptions(**values)
    plausible_rates(spec.shape, spec.world_size, {"bandwidth_gbps": options.bandwidth_gbps})
    target = None
    if any(v is not None for v in (options.to_tp, options.to_pp, options.to_dp)):
        if not resolve.engine_class(spec.engine).universal:
            raise UsageError(f"to_tp/to_pp/to_dp: engine={spec.engine} cannot restart at another layout (DeepSpeed's "
                             "universal-checkpoint converter reads torch.save files only); accepted: engine="
                             + ", ".join(n for n, c in registry.all_engines().items() if c.universal))
        try:
            target = spec.with_layout(tp=options.to_tp or spec.tp, pp=options.to_pp or spec.pp,
                                      dp=options.to_dp or spec.dp, ranks_per_node=None)
        except UsageError as exc:
            given = " ".join(f"to_{k}={v}" for k, v in (("tp", options.to_tp), ("pp", options.to_pp),
                                                        ("dp", options.to_dp)) if v is not None)
            raise UsageError(f"{given}: {exc}") from None
    return PlanRequest(spec, options, target)


def _planned_stacks() -> str:
    return ", ".join(f"stack={n}" for n, cls in stacks.all_stacks().items() if n in stacks.names() and cls.planned)


def parse_predict(tokens: list[str]) -> PredictRequest:
    spec, values = parse_run(tokens, keys_of(PredictOptions))
    if not resolve.stack_class(spec).planned:
        raise UsageError(f"stack={spec.stack}: the prediction model builds on the planner, which predicts DeepSpeed's "
                         f"checkpoint files; accepted: {_planned_stacks()}")
    options, typed = PredictOptions(**values), pairs_of(tokens[1:])
    if (options.write_gbps is None) != (options.read_gbps is None):
        given = "write_gbps" if options.write_gbps is not None else "read_gbps"
        raise refused(given, typed[given], "give write_gbps= and read_gbps= together", "both, or neither (the cached "
                      "baseline)")
    if options.crossover_min_bytes >= options.crossover_max_bytes:  # the key typed is the one named
        name, other = ("crossover_min_bytes", "crossover_max_bytes")[::1 if "crossover_min_bytes" in typed else -1]
        raise refused(name, typed[name], f"{'not below' if name.endswith('min_bytes') else 'not above'} "
                      f"{other}={getattr(options, other):,}", "crossover_min_bytes below crossover_max_bytes (the "
                      "checkpoint sizes the crossover looks at)")
    plausible_rates(spec.shape, spec.world_size, dataclasses.asdict(options))
    return PredictRequest(spec, options)


# ---- restart ---------------------------------------------------------------------------------------------------
def restart_keys() -> dict[str, Key]:
    """What a restart-only re-run may change (nothing the ranks' checkpoint depends on)."""
    return {k: v for k, v in run_keys().items() if v.restart}


def parse_restart(tokens: list[str], complete: Callable[[RunSpec], RunSpec]) -> RestartRequest:
    """`restart run=RUN_DIR [key=value ...]`: the run's spec.json with the overrides applied, `complete`d unless a job
    of its own launches the restarts, resolved once. The run's status and checkpoint are checked in preflight."""
    if tokens and "=" not in tokens[0]:
        raise UsageError(f"{tokens[0]!r}: restart takes no MODEL (the run's spec.json has it); "
                         "usage: ./submit-job.sh restart run=RUN_DIR [cache=warm] [repeats=N]")
    pairs = pairs_of(tokens)
    pairs.pop("phase", None)  # `phase=restart` spelled as a key
    options, pairs = fill(keys_of(RestartOptions), pairs)
    required(keys_of(RestartOptions), options, "restart")
    if why := why_unresolvable(options["run"]):
        raise refused("run", options["run"], why, "the run directory an earlier run printed")
    run = records.read(FsPath(options["run"]).expanduser())  # its record: resolved once, with the restarts' spec
    allowed = restart_keys()
    # the engine's options that act only at restart (how it reads: engine=lazy's read_io, readers, broadcast_load)
    engine_allowed = {k: v for k, v in keys_of(resolve.engine_class(run.spec.engine).Options).items() if v.restart}
    overrides, engine_overrides = {}, {}
    for name, text in pairs.items():
        if name in engine_allowed and name not in allowed:
            engine_overrides[name] = coerce(engine_allowed[name], text)
            continue
        if name not in allowed and name not in run_keys() and name not in shape_keys() \
                and name not in keys_of(resolve.engine_class(run.spec.engine).Options):
            raise unknown(name, text, ["run", *allowed, *engine_allowed], run.spec.engine)
        if name not in allowed:
            fixed = "(fixed by its spec.json)" if name not in ("dry_run", "results_dir", "max_runs") else \
                f"(its restarts are launched into the run's own folder: it takes no {name})"
            raise refused(name, text, f"cannot change for a restart of an existing run {fixed}",
                          f"with restart: run, {', '.join([*allowed, *engine_allowed])}")
        overrides[name] = coerce(allowed[name], text)
    if "launcher" in overrides:
        overrides["launcher"] = resolve.launcher_class(overrides["launcher"]).name
    if engine_overrides:
        overrides["engine_options"] = {**run.spec.engine_options, **engine_overrides}
    spec = dataclasses.replace(run.spec, **overrides, phase="restart", dry_run=False)
    if LAYOUT_KEYS & overrides.keys():
        spec = _restart_layout(spec, run.spec, overrides.keys())
        if "threads" not in overrides:
            spec = dataclasses.replace(spec, threads=None)  # this node's CPUs over the new ranks per node
    spec = spec if resolve.launcher_class(spec.launcher).submits() else complete(spec)  # threads at a new layout
    return RestartRequest(resolve.of_record(run, spec=spec), run.spec, [f"{k}={v}" for k, v in pairs.items()])


LAYOUT_KEYS = frozenset({"tp", "pp", "dp", "nodes", "ranks_per_node", "replicate"})


def _restart_layout(spec: RunSpec, original: RunSpec, given: Collection[str]) -> RunSpec:
    """A restart at another layout: keys not given keep the run's values (ranks per node follows); the model and the
    stack must take the new layout; the global batch stays the run's (micro-batch and accumulation adjusted), so the
    first step after the restart trains on the same samples as at the original layout."""
    layout = {}
    if "ranks_per_node" not in given:
        layout["ranks_per_node"] = None
    if "dp" not in given and "ranks_per_node" in given:
        layout["dp"] = None
    spec = spec.with_layout(**layout)
    kinds = resolve.kinds(spec)
    kinds.stack.check(spec, kinds.engine, kinds.target)
    batch = original.global_batch
    if batch % spec.dp:
        raise UsageError(f"dp={spec.dp}: the run's global batch of {batch} samples (micro_batch {original.micro_batch} "
                         f"x grad_accum {original.grad_accum} x dp {original.dp}) does not split over {spec.dp} "
                         "data-parallel ranks; accepted: dp dividing it")
    per_rank = batch // spec.dp
    micro_batch = max(m for m in range(1, min(original.micro_batch, per_rank) + 1) if per_rank % m == 0)
    return dataclasses.replace(spec, micro_batch=micro_batch, grad_accum=per_rank // micro_batch)
