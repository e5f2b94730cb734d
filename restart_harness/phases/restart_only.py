"""Restart-only re-runs (`./submit-job.sh restart run=DIR`): the restart phase of an existing run, again, `repeats`
times, each with a record of its own; the run at its own layout or another (the stack's conversion first), with
the keys a restart may change (cache, launcher, anatomy, ...). Then the run is summarized again."""

from __future__ import annotations

from pathlib import Path

from restart_harness.errors import RunFailed
from restart_harness.phases import say
from restart_harness.phases.processes import check_nodes
from restart_harness.phases.restart import abort_incomplete_uploads, integrity_line, restarts
from restart_harness.phases.run import discard_checkpoint, submit_restart_job
from restart_harness.results import finalize
from restart_harness.rundir.status import observed


def restart_only(request) -> Path:
    """`request` (command/parse.py RestartRequest): the run with the restarts' spec, the spec as made, how many.

    The run's state stays what its own phases made it (a run whose checkpoint phase failed stays failed, a crashed
    one becomes failed with that reason): a re-run that fails, is interrupted or does not verify is that re-run's
    outcome (records/<record>.json, the summary's restarts), never the run's, so what was verified stays visible."""
    at = request.run  # with the restarts' own spec, completed on this node (command/parse.py parse_restart)
    if at.launcher.submits():
        return submit_restart_job(at, request.repeats, request.tokens)
    spec, run_dir = at.spec, at.run_dir
    prior = observed(run_dir)
    state, reason = ("complete", None) if prior["state"] == "complete" else ("failed", prior.get("reason"))
    tag = at.stored.latest()
    layouts = {"saved": request.original.layout, "loaded": spec.layout}
    say(f"run {run_dir.name}: {request.repeats} restart(s) of {spec.model_label} from {tag}, saved at "
        f"{layouts['saved']}, loaded at {spec.layout}; launcher {spec.launcher}, cache={spec.cache}")
    launched: list[str] = []
    try:
        check_nodes(at)  # inside a restart job: its nodes, with the run's engine and device
        relayout, facts = None, {"layout": layouts}
        if request.integrity:
            facts["integrity"] = request.integrity
            say(f"  {integrity_line(tag, request.integrity)}")
        if (uploads := abort_incomplete_uploads(at, "setup")) is not None:
            facts["incomplete_uploads"] = uploads
        if request.relayout:
            relayout = at.stack.relayout(at, request.original, tag, say)
            if relayout.conversion:
                facts["conversion"] = relayout.conversion
        launched = restarts(at, request.repeats, relayout, facts, own_spec=True)
    finally:
        summary = finalize.finalize(at, state=state, reason=reason, as_made=request.original)
    failed = [r for r in summary["restarts"] if r["record"] in launched and not r["verified"]]
    if failed:  # each verified on every rank, but a first loss at another layout did not continue the run's
        raise RunFailed(f"{failed[-1]['record']}: restart did not restore the saved state: "
                        + ", ".join(failed[-1]["differing"][:5]))
    if not spec.keep:
        discard_checkpoint(at)
    return run_dir
