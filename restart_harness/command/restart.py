"""`restart run=RUN_DIR [key=value ...]`: restart-only re-runs of an earlier run, with what they may change."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path as FsPath

from restart_harness import resolve
from restart_harness.command.options import RestartOptions
from restart_harness.command.requests import RestartRequest
from restart_harness.command.run import unknown
from restart_harness.command.tokens import fill, pairs_of, required
from restart_harness.errors import UsageError, refused
from restart_harness.files.fsfacts import why_unresolvable
from restart_harness.spec import record as records
from restart_harness.spec.keys import Key, coerce, keys_of
from restart_harness.spec.model_shape import shape_keys
from restart_harness.spec.relayout import LAYOUT_KEYS, restart_layout
from restart_harness.spec.runspec import RunSpec, run_keys


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
    options: dict = {}
    pairs = fill(options, keys_of(RestartOptions), pairs)
    required(keys_of(RestartOptions), options, "restart")
    if why := why_unresolvable(options["run"]):
        raise refused("run", options["run"], why, "the run directory an earlier run printed")
    run = records.read(FsPath(options["run"]).expanduser())  # its record: resolved once, with the restarts' spec
    allowed = restart_keys()
    # the engine's options that act only at restart (how it reads: engine=lazy's read_io, readers, broadcast_load)
    engine_allowed = {k: v for k, v in keys_of(resolve.engine_class(run.spec.engine).Options).items() if v.restart}
    overrides: dict = {}
    engine_overrides: dict = {}
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
        kinds = resolve.kinds(spec)
        spec = restart_layout(spec, run.spec, overrides.keys(),
                              lambda at: kinds.stack.check(at, kinds.engine, kinds.target))
        if "threads" not in overrides:
            spec = dataclasses.replace(spec, threads=None)  # this node's CPUs over the new ranks per node
    spec = spec if resolve.launcher_class(spec.launcher).submits() else complete(spec)  # threads at a new layout
    return RestartRequest(resolve.of_record(run, spec=spec), run.spec, [f"{k}={v}" for k, v in pairs.items()])
