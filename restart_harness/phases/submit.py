"""A run (or its restart-only re-runs) as a batch scheduler's job, from outside one of its jobs: the job script
written, submitted, recorded (job.json, job-restart-N.json), and with wait=true followed until it ends. Inside the
job, phases/job.py runs the phases."""

from __future__ import annotations

import os
import time
from pathlib import Path

from restart_harness import resolve
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic
from restart_harness.phases import say
from restart_harness.phases.processes import new_lines, progress_line
from restart_harness.rundir.scripts import write_job_script
from restart_harness.rundir.status import observed, set_status


def submit(run: resolve.Run) -> Path:
    """Submit the run's job (job.sbatch, job.pbs); with wait=true follow it until it ends."""
    spec, scheduler = run.spec, run.scheduler
    script = write_job_script(run)
    job_id = scheduler.submit(script)
    write_json_atomic(run.run_dir / "job.json", {"scheduler": spec.launcher, "job_id": job_id, "script": script.name,
                                                 "submitted": time.time()})
    set_status(run.run_dir, "submitted", None, scheduler=spec.launcher, job_id=job_id)
    say(f"run {run.run_dir.name}: submitted {script.name} to {spec.launcher} as job {job_id}")
    print(f"job {job_id}")
    if spec.wait:
        wait_for_job(run, job_id)
    return run.run_dir


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
    run_dir, spec, scheduler = run.run_dir, run.spec, run.scheduler
    for n in range(1, 10000):
        claim = run_dir / f"job-restart-{n}.json"
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # exclusive: concurrent submissions
            break
        except FileExistsError:
            continue
    script = write_job_script(run, ["phase=restart", *tokens], name=scheduler.script_name.replace("job.", f"job-restart-{n}."))
    job_id = scheduler.submit(script)
    write_json_atomic(claim, {"scheduler": spec.launcher, "job_id": job_id, "script": script.name,
                              "submitted": time.time(), "phase": "restart", "args": tokens})
    say(f"run {run_dir.name}: submitted {script.name} ({repeats} restart(s)) to {spec.launcher} as job {job_id}")
    print(f"job {job_id}")
    return run_dir
