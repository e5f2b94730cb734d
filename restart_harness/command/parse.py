"""The command line -> one validated request (command/requests.py): which command the words name (the older
spellings `phase=restart run=DIR` and `MODEL ... plan=true|json` too), and the parsers of the commands that have no
module of their own. Pure: reads only the files the command names, never checks or changes the machine
(restart_harness/preflight.py)."""

from __future__ import annotations

import re

from engines import registry
from restart_harness import resolve
from restart_harness.command.options import (
    MATRIX_STACK_CASES,
    MLPERF_FIXED,
    BaselineOptions,
    CalibrateOptions,
    CleanOptions,
    MatrixOptions,
    MlperfOptions,
)
from restart_harness.command.plan import parse_plan, parse_predict
from restart_harness.command.requests import MlperfRequest, RestartRequest, Strategy, StudyRequest
from restart_harness.command.restart import parse_restart, restart_keys
from restart_harness.command.run import COMMANDS, is_sweep, parse_run, parse_sweep
from restart_harness.command.study import parse_study
from restart_harness.command.tokens import fill, options_of, pairs_of
from restart_harness.errors import UsageError, refused
from restart_harness.spec.keys import coerce, keys_of, parse_bool
from restart_harness.spec.model_shape import load_model, preset_names, shape_keys
from restart_harness.spec.runspec import run_keys

# what the other modules and cli.py ask of this one by name (each command's parser lives in its own module)
__all__ = ["RestartRequest", "Strategy", "StudyRequest", "is_sweep", "parse_plan", "parse_predict", "parse_restart",
           "parse_study", "parse_sweep", "preset_names", "restart_keys"]


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """(command, its tokens). The command word is optional (run); the older spellings map onto commands."""
    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if "phase=restart" in argv:
        return "restart", [t for t in argv if t != "phase=restart"]
    if any(t.startswith("plan=") for t in argv):
        plan = next(t for t in argv if t.startswith("plan="))
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
    cls = {"calibrate": CalibrateOptions, "clean": CleanOptions, "baseline": BaselineOptions}[command]
    return options_of(cls, tokens, command)


def parse_matrix(tokens: list[str]) -> MatrixOptions:
    options = options_of(MatrixOptions, tokens, "matrix")
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
    values: dict = {}
    fill(values, keys_of(MlperfOptions), dict(pairs))
    checkpoints = values.get("checkpoints", MlperfOptions.checkpoints)
    declared = run_keys()
    if "subset" in pairs and coerce(declared["subset"], pairs["subset"]):  # MLPerf's subset: one host of 8 GPUs
        per_node = coerce(declared["ranks_per_node"], pairs.setdefault("ranks_per_node", "8"))
        pairs.setdefault("nodes", str(max(1, workload.ranks // per_node)))
    pairs.setdefault("keep", "false")  # each run's checkpoints deleted after its reads, as MLPerf's tool reuses its
    spec, values = parse_run([workload.preset, *workload.layout_tokens, "emulate=true", "engine=default",
                              "cache=drop", f"iters={checkpoints}", "save_interval=1",
                              *(f"{k}={v}" for k, v in pairs.items())], keys_of(MlperfOptions))
    return MlperfRequest(workload, MlperfOptions(**values), spec, rest)
