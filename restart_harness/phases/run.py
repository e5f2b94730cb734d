"""One run: the run directory prepared (rundir/), then, by what was asked and where: written only (dry_run=true),
submitted as a batch job (a scheduler's launcher from outside its jobs; restart-only re-runs too), or executed
here - the storage baseline and the prediction, the checkpoint phase, the restart phase in fresh processes, and the
summary. Inside a batch job, phases/job.py runs the phases."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from restart_harness import launchers, machine, resolve
from restart_harness.errors import RunFailed
from restart_harness.files import baseline
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.phases import say
from restart_harness.phases.processes import check_nodes, failure, launch_of, new_lines, progress_line, show_node_checks
from restart_harness.phases.restart import abort_incomplete_uploads, integrity_line, restarts, whole_checkpoint
from restart_harness.plan import checkpoint, estimate
from restart_harness.results import finalize
from restart_harness.rundir import scripts
from restart_harness.rundir.create import port_of, prepare, write_scripts
from restart_harness.rundir.status import observed, save_record, set_status
from restart_harness.schema import count
from restart_harness.spec import record as records

# parameters a rank from which a bf16 step on a CPU without AVX-512 takes seconds (docs/measurements.md#bf16-on-cpu)
SLOW_BF16_PARAMETERS = 10_000_000


def run(plugins: resolve.Plugins, prefix: str = "") -> Path:
    """Prepare, then: dry_run -> print what was written; a scheduler's launcher -> submit the job; else execute
    here."""
    made = prepare(plugins, prefix)
    warn(made)
    if made.spec.dry_run:
        set_status(made.run_dir, "dry_run", "dry_run=true: written, nothing launched")
        job = scripts.write_job_script(made) if made.launcher.scheduler else None
        scripts.show_generated(made.run_dir)
        show_node_checks(made)
        print("==> nothing was launched <==\nto run it: the same command without dry_run=true"
              + (f" (it submits {job.name} to {made.scheduler.name})" if job else
                 f"; or by hand, phase by phase: bash {made.run_dir / 'launch-checkpoint.sh'}, then the restart's "
                 "script once the checkpoint is committed (the harness's own run also measures, verifies and "
                 "summarizes)"))
        return made.run_dir
    return submit(made) if made.launcher.submits() else execute(made)


def warn(run: resolve.Run) -> None:
    """What the run is allowed to do but no one means, said once before anything starts."""
    spec = run.spec
    if spec.across_nodes and spec.ranks_per_node % spec.tp and not spec.emulate:
        # allowed, as DeepSpeed and Megatron allow it
        say(f"warning: tp={spec.tp} with ranks_per_node={spec.ranks_per_node}: tensor-parallel groups span nodes, so "
            "every layer's all-reduces cross the network (training steps slow down; the checkpoint's files are the "
            "same)")
    if (spec.device == "cpu" and spec.precision == "bf16" and not spec.emulate and not run.launcher.submits()
            and spec.shape.num_parameters() / (spec.tp * spec.pp) >= SLOW_BF16_PARAMETERS
            and machine.bf16_matmul_is_slow()):
        say("warning: precision=bf16 on a CPU without AVX-512: torch's bf16 matrix products run here about 15-60x "
            "slower than fp32 (measured: docs/measurements.md#bf16-on-cpu), so at this size training steps dominate "
            "the run; precision=fp32 keeps them short (the checkpoint then holds fp32 weights)")


def in_job(run_dir: Path) -> resolve.Run:
    """Inside a batch job: the run prepare() wrote, completed on this node (complete_in_job) and resolved once."""
    made = records.read(run_dir)
    the_run = resolve.of_record(made, spec=machine.complete_in_job(made.spec))
    if the_run.spec != made.spec:
        the_run.write()
        write_scripts(the_run, port_of(the_run))
    return the_run


def execute(the_run: resolve.Run) -> Path:
    """checkpoint phase -> cache state -> restart phase -> summary, for the Run prepare() returned (or in_job()'s)."""
    spec, run_dir = the_run.spec, the_run.run_dir
    job = launchers.job_id()
    set_status(run_dir, "running", **({"job_id": job} if job else {}))
    subset = f", subset: the first {spec.launched_ranks}" if spec.subset else ""
    say(f"run {run_dir.name}: {spec.model_label}, {spec.layout} ({count(spec.world_size, 'rank')}{subset}, {spec.device}), "
        f"engine {spec.engine}, {spec.precision}, launcher {spec.launcher}")
    try:
        check_nodes(the_run)
        probe = None
        if spec.baseline and the_run.engine.saves:  # cached, or a bounded probe at the checkpoint's typical file
            files = checkpoint.files(spec)
            probe = baseline.for_run(the_run.target.storage_probe(), estimate.typical_file_bytes(files), spec.launched_ranks,
                                     spec.baseline_max_age_hours * 3600, sum(f.bytes for f in files))
            write_json_atomic(run_dir / "baseline.json", probe)
            say(f"  [baseline] {probe.get('error') or baseline_line(probe)}")
        if line := record_prediction(the_run, probe):
            say(f"  [predict] {line}")
        say(f"  [checkpoint] launching {count(spec.launched_ranks, 'rank')} (log: {run_dir / 'logs/checkpoint.log'})")
        info = launch_of(the_run, "checkpoint")  # the ranks train and checkpoint (launch-checkpoint.sh)
        info["incomplete_uploads"] = abort_incomplete_uploads(the_run, "checkpoint")
        save_record(run_dir, info)
        if info["exit_code"] != 0:
            raise RunFailed(failure(the_run, info))
        if spec.phase == "all" and the_run.engine.saves:
            integrity = whole_checkpoint(the_run)
            restarts(the_run, 1, facts={"integrity": integrity} if integrity else None)
        summary = finalize.finalize(the_run, state="complete")
    except (RunFailed, KeyboardInterrupt) as exc:
        finalize.finalize(the_run, state="failed", reason=str(exc) if isinstance(exc, RunFailed) else "interrupted")
        raise
    if summary["status"]["state"] != "complete":  # a restart that verified on every rank, but not its first loss
        raise RunFailed(summary["status"]["reason"])
    if not spec.keep:
        discard_checkpoint(the_run)
    return run_dir


def discard_checkpoint(run: resolve.Run) -> None:
    """keep=false: delete the checkpoint after the results are written (summary.json already describes it)."""
    say(f"  keep=false: deleted {run.stored.delete()}")
    status = read_json(run.run_dir / "status.json")
    write_json_atomic(run.run_dir / "status.json", {**status, "checkpoint_deleted": True})


# ---- before the checkpoint phase: the prediction, and the storage baseline's line -------------------------------
def record_prediction(run: resolve.Run, probe: dict | None) -> str | None:
    """What the calibration in force predicts for this run, into prediction.json (the summary sets it beside what is
    measured); one line for the terminal. None where the planner cannot plan it."""
    from restart_harness.predict import forecast
    from restart_harness.results import prediction as pr

    if not run.stack.planned:
        return None
    spec = run.spec
    try:
        store = forecast.storage(run, record=probe if probe and not probe.get("error") else None)
        made = forecast.build(run, (run.facts.get("host") or {}).get("cpus") or 1, store)
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop a run; its failure is recorded instead
        made = {"error": f"{type(exc).__name__}: {exc}"}
    write_json_atomic(run.run_dir / pr.FILE, made)
    if made.get("error"):
        return f"no prediction: {made['error']}"
    p = made["phases"]
    shown = (("durable save", "save_durable_seconds"), ("restart with launcher", pr.TOTAL))
    parts = [f"{label} {p[name]['seconds']:.2f} s" + (f" ({p[name]['borrowed'].split(':')[0]})"
                                                      if p[name].get("borrowed") else "")
             for label, name in shown if p[name].get("seconds") is not None]
    if (whole := forecast.run_wall_seconds(run, made)) is not None:
        parts.append(f"the whole run about {estimate.duration(whole)}")
    other = " - calibrated on ANOTHER DEVICE, its rates, not this one's" if made.get("other_device") else ""
    return f"calibration {spec.calibration}: " + (", ".join(parts) or "nothing predicted (see prediction.json)") + other


def baseline_line(b: dict) -> str:
    """The storage baseline in one line; a cached one says where and when it was measured (the cache is per file
    system and user, so it may be another checkout's or another run's folder on the same storage)."""
    age = (f"(cached: measured {b['age_seconds'] / 3600:.1f} h ago in {b.get('dir')}, on the same file system) "
           if b["cached"] and b.get("age_seconds") is not None else "")
    c = b.get("ceiling")
    ceiling = f"; ceiling write {c['write_mib_s']} MiB/s, read {c['read_mib_s']} MiB/s" if c else ""
    return (f"storage {age}write {b['write_mib_s']} MiB/s, read {b['read_mib_s']} MiB/s "
            f"({b['method']}, {b['ranks']} x {b['file_bytes']} bytes){ceiling}")


# ---- a batch scheduler's job, from outside one ----------------------------------------------------------------
def submit(run: resolve.Run) -> Path:
    """Submit the run's job (job.sbatch, job.pbs); with wait=true follow it until it ends."""
    job_id = _submit(run, scripts.write_job_script(run), run.run_dir / "job.json")
    set_status(run.run_dir, "submitted", None, scheduler=run.spec.launcher, job_id=job_id)
    if run.spec.wait:
        wait_for_job(run, job_id)
    return run.run_dir


def _submit(run: resolve.Run, script: Path, record: Path, what: str = "", **facts) -> str:
    """Submit the job script, record it (`record`: job.json, job-restart-N.json) and say so; the job's id."""
    job_id = run.scheduler.submit(script)
    write_json_atomic(record, {"scheduler": run.spec.launcher, "job_id": job_id, "script": script.name,
                               "submitted": time.time(), **facts})
    say(f"run {run.run_dir.name}: submitted {script.name}{what} to {run.spec.launcher} as job {job_id}")
    print(f"job {job_id}")
    return job_id


def wait_for_job(run: resolve.Run, job_id: str, poll_seconds: float = 2.0) -> None:
    """wait=true: follow a submitted job until it ends (its state, rank 0's progress of each phase); returns once the
    run is complete, else RunFailed with the run's own one-line reason. Ctrl-C stops the waiting, not the job."""
    run_dir, scheduler = run.run_dir, run.scheduler
    say(f"  waiting for job {job_id} (wait=true; Ctrl-C stops waiting, the job goes on)")
    last, offsets = "", {}
    while True:
        state = scheduler.job_state(job_id)
        if (state or "ended") != last:
            last = state or "ended"
            say(f"  [job {job_id}] {last.lower()}")
        for events in sorted((run_dir / "events").glob("*/rank-00000.jsonl")):
            record = events.parent.name
            lines, offsets[record] = new_lines(events, offsets.get(record, 0))
            for e in lines:
                if msg := progress_line(record, e):
                    say(msg)
        if state is None or state in scheduler.ended_states:
            break
        time.sleep(poll_seconds)
    status = observed(run_dir)
    if status["state"] == "complete":
        return
    if status["state"] in ("submitted", "running"):
        raise RunFailed(f"job {job_id} ended ({last.lower()}) without finishing the run; its log: "
                        f"{run_dir / 'logs'}")
    raise RunFailed(status.get("reason") or f"job {job_id} ended, run {status['state']}")


def submit_restart_job(run: resolve.Run, repeats: int, tokens: list[str]) -> Path:
    """Restart-only re-runs with a scheduler's launcher from outside an allocation: a batch job of their own (records
    are claimed inside the job, when each restart starts). Writes job-restart-N.<ext> and its .json."""
    for n in range(1, 10000):
        claim = run.run_dir / f"job-restart-{n}.json"
        with contextlib.suppress(FileExistsError):
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # exclusive: concurrent submissions
            break
    script = scripts.write_job_script(run, ["phase=restart", *tokens],
                                      name=run.scheduler.script_name.replace("job.", f"job-restart-{n}."))
    _submit(run, script, claim, f" ({repeats} restart(s))", phase="restart", args=tokens)
    return run.run_dir


# ---- restart-only re-runs (`./submit-job.sh restart run=DIR`): the restart phase of an existing run again, `repeats`
# times, at its own layout or another (the stack's conversion first); then the run is summarized again ------------
def restart_only(request) -> Path:
    """`request` (command/parse.py RestartRequest): the run with the restarts' spec, the spec as made, how many.

    The run's state stays what its own phases made it (a run whose checkpoint phase failed stays failed, a crashed
    one becomes failed with that reason): a re-run that fails, is interrupted or does not verify is that re-run's
    outcome (records/<record>.json, the summary's restarts), never the run's, so what was verified stays visible."""
    at = request.run  # with the restarts' own spec, completed on this node (command/parse.py parse_restart)
    if at.launcher.submits():
        return submit_restart_job(at, at.spec.repeats, request.tokens)
    spec, run_dir = at.spec, at.run_dir
    prior = observed(run_dir)
    state, reason = ("complete", None) if prior["state"] == "complete" else ("failed", prior.get("reason"))
    tag = at.stored.latest()
    layouts = {"saved": request.original.layout, "loaded": spec.layout}
    say(f"run {run_dir.name}: {spec.repeats} restart(s) of {spec.model_label} from {tag}, saved at "
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
        launched = restarts(at, spec.repeats, relayout, facts, own_spec=True)
    finally:
        summary = finalize.finalize(at, state=state, reason=reason, as_made=request.original)
    failed = [r for r in summary["restarts"] if r["record"] in launched and not r["verified"]]
    if failed:  # each verified on every rank, but a first loss at another layout did not continue the run's
        raise RunFailed(f"{failed[-1]['record']}: restart did not restore the saved state: "
                        + ", ".join(failed[-1]["differing"][:5]))
    if not spec.keep:
        discard_checkpoint(at)
    return run_dir
