"""Checks of the machine and the storage, after the command line is validated and the spec completed against the
machine (machine.resolve), before anything is created: whether the engine and the stack run here, the launcher's
tools, that the result folder can be created (proven with a probe, not guessed), that the checkpoint target takes
the checkpoints (the target's own preflight: folders, free space, a bucket and credentials), and for a restart-only
re-run that the run is finished and its committed checkpoint whole. Each problem is one UsageError line (exit code
2). Nothing here changes the spec or the machine (but for removing a JIT build lock no process holds)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from restart_harness import machine, nodecheck, resolve
from restart_harness.command.options import BaselineOptions
from restart_harness.command.parse import RestartRequest
from restart_harness.errors import UsageError, refused
from restart_harness.files import baseline as baseline_store
from restart_harness.files import checksum, exclusive
from restart_harness.files.fsfacts import why_not_a_directory
from restart_harness.plan.estimate import size_text as _gib
from restart_harness.resolve import Plugins
from restart_harness.results import events as ev
from restart_harness.schema import PREDICTED_TOTAL
from restart_harness.spec import environment
from restart_harness.spec.runspec import RunSpec


def directory(key: str, path: str) -> None:
    if reason := why_not_a_directory(Path(path)):
        raise UsageError(f"{key}={path}: {reason}")


def output_file(key: str, path: str) -> None:
    """A file the command will create: its folder can be written (or made), and nothing is there yet (never
    overwritten: files/exclusive.py)."""
    where = Path(path).expanduser()
    if where.is_dir():
        raise UsageError(f"{key}={path}: a directory; accepted: the path of a file to write")
    if reason := why_not_a_directory(where.parent) or exclusive.taken(path):
        raise UsageError(f"{key}={path}: {reason}")


def planned_bytes(plugins: Plugins, saves: int | None = None) -> int:
    """Bytes every checkpoint of the run would take (the planner's files as the engine stores them; the run keeps
    every tag)."""
    from restart_harness.plan import checkpoint

    spec = plugins.spec
    files = checkpoint.stored_files(spec, plugins.engine.files())
    return (spec.save_count if saves is None else saves) * sum(f.bytes for f in files if f.rank < spec.launched_ranks)


def tracer(spec: RunSpec) -> None:
    from third_party.dftracer_compat import preload_library

    if spec.trace and preload_library() is None:
        raise UsageError("trace=true needs dftracer (the PyPI package), which this Python lacks: "
                         "pip install 'restart-harness[trace]' (or dftracer==2.2.0), or trace=false")


def attribution(plugins: Plugins) -> None:
    """attribution= where its sampler cannot see the ranks: not a refusal (the run is still worth its phase timings),
    one line that says why, before anything starts; each launch's record says it again (rundir/sampling.py)."""
    from restart_harness.rundir import sampling

    if why := sampling.unavailable(plugins.spec, plugins.launcher):
        print(f"[setup] attribution={plugins.spec.attribution}: not available here, the run goes on with phase "
              f"timings only: {why}", file=sys.stderr, flush=True)


def emulation(plugins: Plugins, fixed_layout: str | None = None) -> None:
    """emulate=true: the largest file's state fits in the memory budget (a rank holds one file at a time, or streams
    it); the budget of a submitted run is the compute node's (checked inside the job). `fixed_layout`: who fixes the
    layout (an MLPerf workload), so that the advice names only what can change."""
    from restart_harness.plan import checkpoint
    from restart_harness.stacks.emulated import streamable

    spec = plugins.spec
    if not spec.emulate or spec.emulate_memory_gib is None:
        return
    able = streamable(type(plugins.engine))
    need = checkpoint.emulated_file_state_bytes(spec, able)
    if need <= spec.emulate_memory_gib * 2**30:
        return
    if checkpoint.emulation_streams(spec, able):
        raise UsageError(f"emulate=true: a rank streaming its files needs {need / 2**30:,.2f} GiB of memory (its random "
                         f"data and one chunk, whatever the file's size) but emulate_memory_gib="
                         f"{spec.emulate_memory_gib:g}; give emulate_memory_gib= at least {need / 2**30:,.2f}")
    raise UsageError(f"emulate=true: the largest file needs {need / 2**30:,.1f} GiB of memory to build and save "
                     f"(its tensors, and what the engine stages beside them) but emulate_memory_gib="
                     f"{spec.emulate_memory_gib:g}; "
                     + (f"give more memory (emulate_memory_gib=), or a smaller model (shrink=; {fixed_layout} "
                        "fixes tp, pp and dp)" if fixed_layout else
                        "give more memory, or a layout with more ranks (tp, pp, dp) so that files are smaller"))


def env_hook(spec: RunSpec) -> None:
    if spec.env_hook and not Path(spec.env_hook).is_file():
        raise refused("env_hook", spec.env_hook, "a directory" if Path(spec.env_hook).is_dir() else "no such file",
                      "a bash file sourced before the ranks start")


def paths(plugins: Plugins) -> None:
    """The folders and files a campaign's runs will use (results_dir, ckpt_dir, env_hook), checked before it
    creates its own folder, as a run's are (study: whatever its fidelity)."""
    directory("results_dir", plugins.spec.results_dir)
    plugins.target.preflight("ckpt_dir", None, reach=False)
    env_hook(plugins.spec)


# What one rank holds, measured here (docs/faults.md): a process with torch and DeepSpeed imported peaks at ~410 MiB
# (tiny); training state adds about three times the rank's share of a checkpoint (its weights, gradients, optimizer
# partition and the staging of a save: `small` dp=2, 376 MiB a rank, peaked at 1.1-1.4 GiB).
RANK_BASE_BYTES = 400 << 20
STATE_FACTOR = 3
RANKS_PER_CPU = 8  # beyond this a rank gets too little of a core to start, rendezvous and train within the timeouts
MEMORY_REFUSAL = "on this node but"  # in resources()' refusal only: the study tells a cell that does not fit memory


def resources(plugins: Plugins) -> None:
    """The ranks this node starts fit its memory (available now: MemAvailable, or less below this process's cgroup
    limit) and CPUs, estimated from the plan; the compute node of a submitted run is the scheduler's. A save and a
    restart hold alike: the process, its training state (an emulated rank: its largest file's tensors, which it keeps
    resident after its wave) and the engine's own buffers (Engine.host_buffer_bytes); an emulated node also the
    staging of the ranks working at once, up to emulate_memory_gib."""
    spec = plugins.spec
    if plugins.launcher.submits() or spec.dry_run:
        return
    ranks, cpus = spec.ranks_per_node, os.cpu_count() or 1
    rank_bytes = planned_bytes(plugins, saves=1) // spec.world_size
    buffers = plugins.engine.host_buffer_bytes(rank_bytes)
    if spec.emulate:
        from restart_harness.plan import checkpoint
        from restart_harness.stacks.emulated import streamable

        streams = checkpoint.emulation_streams(spec, streamable(type(plugins.engine)))
        state = (checkpoint.EMULATED_STREAM_BYTES if streams else
                 checkpoint.emulated_file_state_bytes(spec) // checkpoint.EMULATED_STATE_FACTOR)
        staging = min(int((spec.emulate_memory_gib or 0) * 2**30), ranks * state)
        held = [f"its {'streaming buffers' if streams else 'largest file'}' {_gib(state)}".replace("file'", "file's"),
                f"up to emulate_memory_gib={spec.emulate_memory_gib:g} staging for the node" if staging else ""]
    else:
        state, staging = STATE_FACTOR * rank_bytes, 0
        held = [f"three times its {_gib(rank_bytes)} share of the checkpoint"]
    per_rank = RANK_BASE_BYTES + state + buffers
    need = ranks * per_rank + staging
    available = machine.available_memory_bytes()
    layout = f"tp x pp x dp = {spec.tp} x {spec.pp} x {spec.dp}" + (f" over {spec.nodes} nodes" if spec.nodes > 1 else "")
    if available is not None and need > available:
        held.insert(0, f"engine={spec.engine}'s {_gib(buffers)} of buffers" if buffers else "")
        raise UsageError(f"{layout}: {ranks} ranks need ~{_gib(need)} {MEMORY_REFUSAL} {_gib(available)} is "
                         f"available (~{_gib(per_rank)} each: the process{''.join(', ' + h for h in held if h)}); "
                         "accepted: fewer ranks per node, a smaller model (shrink=), or launcher=slurm|pbs over "
                         "several nodes")
    if ranks > RANKS_PER_CPU * cpus:
        raise UsageError(f"{layout}: {ranks} ranks on this node's {cpus} CPUs (more than {RANKS_PER_CPU} a CPU); "
                         "accepted: fewer ranks per node, or launcher=slurm|pbs over several nodes")


def port(plugins: Plugins) -> None:
    """A rendezvous port given for ranks started on this node must be free here."""
    import socket

    spec = plugins.spec
    if spec.master_port is None or plugins.launcher.scheduler is not None or spec.dry_run:
        return
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", spec.master_port))
        except OSError as exc:
            raise UsageError(f"master_port={spec.master_port}: cannot be used here ({exc.strerror or exc}); "
                             "accepted: a free port, or leave it out (a free one is chosen)") from None


def run(spec: RunSpec, fixed_layout: str | None = None) -> Plugins:
    """A run (or one combination of a sweep): everything that can be checked before the run directory exists
    (`fixed_layout`: who fixes its layout, if not the user); its plug-ins, resolved once (resolve.py), to run it
    with."""
    from restart_harness.predict import fit

    plugins = resolve.plugins(spec)
    here(plugins)
    emulation(plugins, fixed_layout)
    if plugins.scheduler:  # what the scheduler says of the job (Slurm: sbatch --test-only)
        plugins.scheduler.preflight()
    fit.load(spec.calibration)  # the calibration file is one: its phases are used before the checkpoint phase
    directory("results_dir", spec.results_dir)
    need = planned_bytes(plugins) if plugins.engine.saves and not spec.dry_run else None
    plugins.target.preflight("ckpt_dir", need, reach=not spec.dry_run)
    resources(plugins)
    if not spec.dry_run:
        work(plugins)  # last: what cannot fit the node or its disk is said first
        extension_locks()
    return plugins


def here(plugins) -> None:
    """What a run and a restart-only re-run check alike: the cache folder, the engine, the launcher, the staging,
    the port, the nodes, the tracer and the sampler."""
    cache()
    plugins.engine.check()
    env_hook(plugins.spec)
    plugins.launcher.preflight()  # the launcher can run from here (its own checks: launchers/)
    stage(plugins)
    port(plugins)
    # what the node that runs the ranks must have (an engine's module, CUDA and the GPUs, locked memory: nodecheck.py),
    # checked here where the ranks start here; a submitted run's nodes, or a dry run's, may not be this machine: its
    # job checks every node before the checkpoint phase (phases/processes.py)
    if not (plugins.launcher.submits() or plugins.spec.dry_run):
        nodecheck.here(plugins)
    tracer(plugins.spec)
    attribution(plugins)


def cache() -> None:
    """The user cache folder (DeepSpeed's JIT-built ops, storage baselines) can be written (RH_CACHE_DIR), and the
    baselines' scope is one it knows (RH_BASELINE_CACHE)."""
    from restart_harness.files import cache_dir

    if why := baseline_store.scope_problem():
        raise UsageError(why)
    if why := cache_dir.problem():
        where = os.environ.get(cache_dir.ENV)
        raise refused(cache_dir.ENV, where, why, "a folder this user can write, or leave it unset") if where else \
            UsageError(f"the user cache folder {cache_dir.cache_dir()}: {why}; accepted: RH_CACHE_DIR= a folder "
                       "this user can write")


def work(plugins: Plugins) -> None:
    """Each launch fits its time limit by the harness's own prediction (predict/: the arithmetic `./submit-job.sh
    predict` shows): the checkpoint phase (start-up, iters steps, its saves) and a restart (start-up, `after` steps)
    within timeout=, and a submitted run within walltime=. Every key is bounded alone; their product is bounded here.
    A prediction errs both ways, so a run is refused only when even the low end of its range does not fit; where
    nothing is predicted (a device or a group the calibration lacks), nothing is refused."""
    from restart_harness.plan.estimate import duration
    from restart_harness.predict import forecast

    spec = plugins.spec
    if not plugins.stack.planned:
        return
    try:
        store = forecast.storage(plugins)
        if store["write_bytes_per_s"] is None:  # no baseline of this storage yet: its low end, storage at no cost
            store = {**store, "write_bytes_per_s": float("inf"), "read_bytes_per_s": float("inf")}
        made = forecast.build(plugins, os.cpu_count() or 1, store)
    except Exception:  # noqa: BLE001 - a prediction that cannot be made refuses nothing
        return
    phases = made.get("phases") or {}

    def low(name: str) -> float | None:
        return (phases.get(name) or {}).get("low")

    start, step, durable = low(PREDICTED_TOTAL), low("restart_first_step_seconds"), low("save_durable_seconds")
    if start is None or (plugins.stack.trains and step is None):
        return
    step = step or 0.0
    checkpoint = start + max(spec.iters - 1, 0) * step + spec.save_count * (durable or 0.0)
    restart = start + max(spec.after - 1, 0) * step if spec.phase == "all" and plugins.engine.saves else 0.0
    shape = (f"steps of {step:.3g} s at micro_batch={spec.micro_batch} x grad_accum={spec.grad_accum} x "
             f"seq_len={spec.seq_len} tokens" if step else "")
    for phase, seconds, count, keys in (("checkpoint", checkpoint, spec.iters, "iters"),
                                        ("restart", restart, spec.after, "after")):
        if seconds > spec.timeout:
            what = f"{keys}={count} {shape}" if step else f"{spec.save_count} saves"
            raise UsageError(f"the {phase} phase would take at least {duration(seconds)} ({what}, predicted with "
                             f"calibration {spec.calibration}; `./submit-job.sh predict` shows how), more than "
                             f"timeout={spec.timeout} s; accepted: fewer {keys}"
                             + (", a smaller micro_batch, grad_accum or seq_len" if step else "")
                             + f", or timeout= above {int(seconds) + 1}")
    limit = spec.walltime_seconds
    if plugins.launcher.submits() and checkpoint + restart > limit:
        raise UsageError(f"the job would take at least {duration(checkpoint + restart)} (checkpoint and restart "
                         f"phases, predicted with calibration {spec.calibration}), more than walltime={spec.walltime}; "
                         "accepted: a longer walltime=, or fewer iters and after")


def stage(plugins: Plugins) -> None:
    """env_stage=: a folder with room for the environment's copy, on this node (envstage.py); RH_STRACE=1:
    strace is here (iocount/strace.py)."""
    from restart_harness.iocount import strace

    if why := strace.missing(environment.read().RH_STRACE):
        raise UsageError(why)
    spec = plugins.spec
    if spec.env_stage is not None:  # a dry run's too, as its ckpt_dir is: not the room the copy takes
        from restart_harness import envstage

        envstage.check(spec.env_stage, spec.nodes, plugins.launcher.submits(), room=not spec.dry_run)


def extension_locks() -> None:
    """A JIT build lock left by a killed build would hang every rank in init_distributed (third_party)."""
    from restart_harness.files.cache_dir import extensions_dir
    from third_party.torch_extension_lock import remove_stale

    for lock in remove_stale(extensions_dir()):
        print(f"[setup] removed {lock}: a JIT build lock no process holds (left by an interrupted build)",
              file=sys.stderr)


def restart(request: RestartRequest) -> dict | None:
    """A restart-only re-run: the run is not in progress, its launcher and engine run here, its checkpoint is whole,
    and a restart at another layout is one its stack can make. Returns what the check of the checkpoint's content
    read (committed_checkpoint)."""
    from restart_harness.rundir.status import observed

    spec, run_dir, restarts = request.spec, request.run_dir, request.run  # the run at the restarts' own spec
    status = observed(run_dir)
    if status["state"] in ("running", "submitted"):
        where = f"job {status.get('job_id')}" if status["state"] == "submitted" else f"pid {status.get('pid')}"
        raise UsageError(f"run={run_dir}: still {status['state']} ({where}); restart it once it has finished")
    if status["state"] not in ("complete", "failed"):
        raise UsageError(f"run={run_dir}: not a finished run ({status['state']}: {status.get('reason')}); accepted: "
                         "a run whose checkpoint phase ended (complete or failed)")
    here(restarts)  # slurm/pbs outside an allocation: the restarts become a batch job of their own
    if restarts.scheduler:
        restarts.scheduler.preflight()
    extension_locks()
    if elsewhere := restarts.made.checkpoint_elsewhere():
        raise UsageError(f"run={run_dir}: {elsewhere}")
    restarts.target.preflight("run", None)
    tag, integrity = committed_checkpoint(restarts)
    if request.relayout:
        saves = [s for evs in ev.of_kind(ev.read_record(run_dir, "checkpoint"), "save").values() for s in evs
                 if s["tag"] == tag]
        restarts.stack.check_relayout(request.original, spec, type(restarts.engine), type(restarts.target), saves)
    return integrity


def baseline(options: BaselineOptions) -> None:
    cache()
    probe = resolve.target_at(options.dir, key="dir").storage_probe()
    probe.check("dir")
    if options.tool == "fio" and shutil.which("fio") is None:
        raise UsageError("tool=fio: fio is not installed (apt-get install fio); use tool=builtin")
    ranks = options.ranks or min(os.cpu_count() or 1, baseline_store.AUTO_MAX_RANKS)
    need, free = options.file_bytes * ranks, probe.free_bytes()
    if free is not None and need > free // 2:
        raise UsageError(f"file_bytes x ranks = {need} bytes is more than half the {free} bytes free in {options.dir}")


# ---- restart-only: is the committed checkpoint whole? ---------------------------------------------------------
def committed_checkpoint(run: resolve.Run) -> tuple[str, dict | None]:
    """The tag `latest` names, after checking every file the save recorded for it: path and bytes as the target
    stores them, and content where the save recorded checksums (files/checksum.py); raises UsageError naming the
    first missing, truncated or torn file. Returns the tag and what the checksum check read (None: none recorded)."""
    target = run.target
    where = target.describe()
    if gone := run.stored.missing():
        raise UsageError(f"run {run.run_dir.name}: {gone}; nothing to restart from")
    tag = run.stored.latest()
    if tag is None:
        raise UsageError(f"{where}/latest: missing, no checkpoint was committed; nothing to restart from")
    stored = _sizes(run.stored.listing().get(tag, []))
    if not tag or not stored:
        raise UsageError(f"{where}/{tag}: missing, but {where}/latest names it")
    recorded = ev.recorded_files(ev.read_record(run.run_dir, "checkpoint"), tag)
    if not recorded:
        raise UsageError(f"{where}/{tag}: no save of {tag} is recorded in {run.run_dir / 'events' / 'checkpoint'}, "
                         "so it cannot be checked as complete")
    for rel, r in sorted(recorded.items()):
        actual = stored.get(rel)
        if actual is None:
            raise UsageError(f"{where}/{tag}/{rel}: missing (the save of {tag} recorded {r['bytes']} bytes)")
        if actual != r["bytes"]:
            raise UsageError(f"{where}/{tag}/{rel}: {actual} bytes, but the save of {tag} recorded {r['bytes']} "
                             "(truncated or torn)")
    try:
        return tag, checksum.compare(target.root / tag, recorded)
    except checksum.Mismatch as exc:
        raise UsageError(str(exc)) from None


def _sizes(entries: list[tuple[str, int]]) -> dict[str, int]:
    """path -> bytes of every stored file, and of every folder of them (an engine's folder of shards per file)."""
    out: dict[str, int] = {}
    for rel, nbytes in entries:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            out["/".join(parts[:i])] = out.get("/".join(parts[:i]), 0) + nbytes
    return out
