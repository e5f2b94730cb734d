"""Why a launch failed, in one line: a time limit, ranks the launcher says were killed (a lost node), or the first
error a rank recorded, else the exit code and the log to read."""

from __future__ import annotations

from restart_harness import resolve
from restart_harness.results import events as ev
from restart_harness.results import placement


def failure(run: resolve.Run, info: dict) -> str:
    """One line for a launch (records/<record>.json's info) that did not end with exit code 0."""
    run_dir = run.run_dir
    record = ev.read_record(run_dir, info["record"])
    errors = ev.errors(record)
    if info["timed_out"]:
        return f"{info['record']} phase timed out after {info['wall_seconds']:.0f} s (timeout=); process group killed"
    log = run_dir / info["log"]
    verdicts = run.launcher.task_verdicts(log.read_text(errors="replace")) if log.is_file() else {}
    lost = placement.lost(record, run.spec.launched_ranks, verdicts)
    if lost and (not errors or any(v != placement.COLLATERAL for v in verdicts.values())):
        # the launcher says ranks were killed (a node lost): they came first, the others' errors (a peer gone) after
        also = f"; the others' first error: {errors[0]}" if errors else ""
        return f"{info['record']} phase failed: {lost}{also} (exit code {info['exit_code']}; see {log})"
    if errors:
        return f"{info['record']} phase failed: {errors[0]}" + (f"; {lost}" if lost else "")
    return f"{info['record']} phase exited with code {info['exit_code']}; see {run_dir / info['log']}"
