"""One run: the run directory prepared (rundir/), then, by what was asked and where: written only (dry_run=true),
submitted as a batch job (a scheduler's launcher from outside its jobs: phases/submit.py), or executed here - the
checkpoint phase, the restart phase in fresh processes, and the summary."""

from __future__ import annotations

from pathlib import Path

from restart_harness import launchers, machine, resolve
from restart_harness.errors import RunFailed
from restart_harness.phases import nodes, prelude, say, submit
from restart_harness.phases.diagnose import failure
from restart_harness.phases.processes import launch_of
from restart_harness.phases.restart import abort_incomplete_uploads, restarts, whole_checkpoint
from restart_harness.results import finalize
from restart_harness.rundir import scripts
from restart_harness.rundir.create import port_of, prepare, write_scripts
from restart_harness.rundir.status import save_record, set_status
from restart_harness.schema import count
from restart_harness.spec import record as records

# parameters a rank from which a bf16 step on a CPU without AVX-512 takes seconds (`small`, 56 M a rank at dp=2: 70 s;
# `tiny`, 0.25 M: 0.13 s) and the run is told so
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
        nodes.show_node_checks(made)
        print("==> nothing was launched <==\nto run it: the same command without dry_run=true"
              + (f" (it submits {job.name} to {made.scheduler.name})" if job else
                 f"; or by hand, phase by phase: bash {made.run_dir / 'launch-checkpoint.sh'}, then the restart's "
                 "script once the checkpoint is committed (the harness's own run also measures, verifies and "
                 "summarizes)"))
        return made.run_dir
    if made.launcher.submits():
        return submit.submit(made)
    return execute(made)


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
        nodes.check_nodes(the_run)
        probe = prelude.record_baseline(the_run)
        if probe:
            say(f"  [baseline] {probe.get('error') or prelude.baseline_line(probe)}")
        if line := prelude.record_prediction(the_run, probe):
            say(f"  [predict] {line}")
        checkpoint_phase(the_run)
        if spec.phase == "all" and the_run.engine.saves:
            integrity = whole_checkpoint(the_run)
            restarts(the_run, 1, facts={"integrity": integrity} if integrity else None)
        summary = finalize.finalize(the_run, state="complete")
    except RunFailed as exc:
        finalize.finalize(the_run, state="failed", reason=str(exc))
        raise
    except KeyboardInterrupt:
        finalize.finalize(the_run, state="failed", reason="interrupted")
        raise
    if summary["status"]["state"] != "complete":  # a restart that verified on every rank, but not its first loss
        raise RunFailed(summary["status"]["reason"])
    if not spec.keep:
        discard_checkpoint(the_run)
    return run_dir


def checkpoint_phase(run: resolve.Run) -> dict:
    """The ranks train and checkpoint (launch-checkpoint.sh); RunFailed with the reason when the launch fails."""
    spec = run.spec
    say(f"  [checkpoint] launching {count(spec.launched_ranks, 'rank')} (log: {run.run_dir / 'logs' / 'checkpoint.log'})")
    info = launch_of(run, "checkpoint")
    info["incomplete_uploads"] = abort_incomplete_uploads(run, "checkpoint")
    save_record(run.run_dir, info)
    if info["exit_code"] != 0:
        raise RunFailed(failure(run, info))
    return info


def discard_checkpoint(run: resolve.Run) -> None:
    """keep=false: delete the checkpoint after the results are written (summary.json already describes it)."""
    from restart_harness.files.atomic import read_json, write_json_atomic

    say(f"  keep=false: deleted {run.stored.delete()}")
    status = read_json(run.run_dir / "status.json")
    write_json_atomic(run.run_dir / "status.json", {**status, "checkpoint_deleted": True})
