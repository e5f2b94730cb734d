"""`phase=restart run=<run-dir> [key=value ...]`: re-run only the restart of an existing run.

No MODEL: the run's spec.json holds the model, layout and engine, and the restart must load exactly the
checkpoint that run wrote. Only keys that change how the restart is launched or observed may be given;
anything else would describe a different run and is refused with one line."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.spec.args import _convert, run_keys
from restart_harness.spec.runspec import RunSpec

# What a restart-only re-run may change: none of these is read by the ranks, so the checkpoint still fits.
RESTART_KEYS = ("cache", "repeats", "timeout", "keep", "launcher", "master_port")


@dataclass
class RestartRequest:
    """An existing run directory, its RunSpec with the restart overrides applied, and how many restarts."""

    run_dir: Path
    spec: RunSpec
    ckpt_root: Path
    repeats: int
    tokens: list[str]  # the overrides as given (key=value), handed on to a submitted restart-only job


def wants_restart(tokens: list[str]) -> bool:
    return "phase=restart" in tokens


def parse_restart(tokens: list[str]) -> RestartRequest:
    """Validate a restart-only command line; raises UsageError before anything is written."""
    from engines import registry
    from restart_harness.launch import launchers, preflight
    from restart_harness.results.status import observed
    from restart_harness.spec.args import split_tokens

    if tokens and "=" not in tokens[0]:
        raise UsageError(f"{tokens[0]!r}: phase=restart takes no MODEL (the run's spec.json has it); "
                         "usage: ./submit-job.sh phase=restart run=RUN_DIR [cache=warm] [repeats=N]")
    _, pairs = split_tokens(["-", *tokens])
    pairs.pop("phase")
    if "run" not in pairs:
        raise UsageError("phase=restart needs run=RUN_DIR (a run directory printed by an earlier run)")
    run_dir = Path(pairs.pop("run")).expanduser()
    keys = run_keys()
    overrides: dict[str, object] = {}
    for key, text in pairs.items():
        if key not in RESTART_KEYS:
            raise UsageError(f"{key}=: cannot change for a restart of an existing run (fixed by its spec.json); "
                             f"accepted with phase=restart: run, {', '.join(RESTART_KEYS)}")
        overrides[key] = _convert(key, text, keys[key])
    if not (run_dir / "spec.json").is_file():
        raise UsageError(f"run={run_dir}: not a run directory (no spec.json)")
    run_dir = run_dir.resolve()
    data = json.loads((run_dir / "spec.json").read_text())
    spec = dataclasses.replace(RunSpec.from_json(data), **overrides)
    spec.phase = "restart"
    spec.dry_run = False
    if spec.repeats < 1 or spec.timeout < 1:
        bad = "repeats" if spec.repeats < 1 else "timeout"
        raise UsageError(f"{bad}={getattr(spec, bad)}: must be a positive integer")
    status = observed(run_dir)
    if status["state"] in ("running", "submitted"):
        where = f"job {status.get('job_id')}" if status["state"] == "submitted" else f"pid {status.get('pid')}"
        raise UsageError(f"run={run_dir}: still {status['state']} ({where}); restart it once it has finished")
    launchers.check(spec)  # slurm/pbs outside an allocation: the restarts become a batch job of their own
    registry.get_spec(spec.engine).check_runnable(spec)
    ckpt_root = Path(data["checkpoint_root"])
    preflight.committed_checkpoint(run_dir, ckpt_root)
    given = [f"{k}={v}" for k, v in pairs.items()]
    return RestartRequest(run_dir=run_dir, spec=spec, ckpt_root=ckpt_root, repeats=spec.repeats, tokens=given)
