"""Run one RunSpec: create the run directory, write the generated artifacts, launch the checkpoint phase,
make the page-cache state asked for, launch the restart phase in fresh processes, and finalize.

prepare() writes; execute() runs the phases from what prepare() wrote (locally, or inside a Slurm/PBS job via
restart_harness.launch.job); restart_only() appends restart records to an existing run. Where the checkpoints are is
the storage target's business (restart_harness/targets/), how a restart at another layout reads them the training
stack's (restart_harness/stacks/)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from engines import registry
from restart_harness import SOURCE_ROOT, launchers, machine, stacks, targets
from restart_harness.errors import RunFailed, UsageError
from restart_harness.generate.ds_config import build_ds_config, deep_merge
from restart_harness.generate.launch import launch_script, worker_args
from restart_harness.iocount import strace
from restart_harness.launch import nodecheck, observe, session, staging
from restart_harness.plan.estimate import duration
from restart_harness.results import finalize
from restart_harness.results.schema import stack_engine
from restart_harness.spec import run as resolved
from restart_harness.spec.runspec import RunSpec
from restart_harness.storage import baseline, pagecache
from restart_harness.storage.atomic import make_fresh_dir, write_json_atomic, write_text_atomic


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def new_run_dir(spec: RunSpec, prefix: str = "") -> Path:
    """results/<model>-<layout>-<engine label>-<time>, created exclusively: a run never reuses another's folder."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = "-".join(stack_engine(dataclasses.asdict(spec)))
    base = prefix + f"{spec.model_label}-{spec.layout}-{label}-{stamp}".replace("/", "_")
    try:
        return make_fresh_dir(Path(spec.results_dir), base)
    except FileExistsError as exc:
        raise RunFailed(str(exc)) from None


def free_port() -> int:
    """A rendezvous port free now. Drawn at random from the dynamic range and tried, not bind(0)'s: two harnesses
    started at the same moment got the same port from bind(0) here (both probes closed before either rank bound it),
    and the second run failed with EADDRINUSE."""
    import random

    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randint(20000, 32767)  # below Linux's ephemeral range (32768-60999), where clients' ports come from
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_status(run_dir: Path, state: str, reason: str | None = None, **extra) -> None:
    """status.json; `running` carries this process's pid and host so a reader can tell a crashed run."""
    status = {"state": state, "reason": reason, "time": time.time(), **extra}
    if state == "running":
        status.update(pid=os.getpid(), host=socket.gethostname())
    write_json_atomic(run_dir / "status.json", status)


def allocate_record(run_dir: Path) -> str:
    """The next free restart record name (restart-01, restart-02, ...), claimed by creating its event folder:
    mkdir is atomic, so two concurrent restart-only re-runs never get the same record."""
    events = run_dir / "events"
    events.mkdir(exist_ok=True)
    for n in range(1, 10000):
        record = f"restart-{n:02d}"
        try:
            (events / record).mkdir()
            return record
        except FileExistsError:
            continue
    raise RunFailed(f"no free restart record name under {events}")


def write_launch(run: resolved.ResolvedRun, phase: str, record: str, port: int, extra: list[str] | None = None,
                 spec: RunSpec | None = None, staged: staging.Staged | None = None) -> Path:
    """launch-<record>.sh: the ranks of one phase (spec: the record's own, for a restart at another layout;
    staged: the environment's copy they run from, env_stage=)."""
    spec = spec or run.spec
    command = launchers.of(spec).rank_command(port, worker_args(run.run_dir, phase, record) + (extra or []))
    if staged is not None:  # every interpreter the launch starts is the copy's
        command = [staged.python if part == sys.executable else part for part in command]
    path = run.run_dir / f"launch-{record}.sh"
    env = {**observe.environment(spec, run.run_dir, record, run.checkpoint_root, staged),
           **targets.for_run(run).launch_environment(run.run_dir / "logs" / "client" / record)}
    write_text_atomic(path, launch_script(spec, phase, command, port, env), mode=0o755)
    return path


def prepare(spec: RunSpec, prefix: str = "") -> resolved.ResolvedRun:
    """The run directory with spec.json (the resolved run), ds_config.json and the launch scripts."""
    run_dir = new_run_dir(spec, prefix)
    set_status(run_dir, "running")
    target = targets.for_spec(spec).placed(run_dir)
    run = resolved.ResolvedRun(run_dir, spec, target.record(run_dir), machine.facts(target.filesystem_path()))
    run.facts["io_sources"] = observe.sources_facts(run_dir, run.checkpoint_root)
    run.write()
    write_json_atomic(run_dir / "ds_config.json", build_ds_config(spec))
    port = spec.master_port or free_port()
    write_launch(run, "checkpoint", "checkpoint", port)
    if spec.phase == "all":
        # written now so that it can be read (dry_run) and re-run by hand; claimed when it is launched
        write_launch(run, "restart", "restart-01", port)
    return run


def _progress_line(record: str, e: dict) -> str | None:
    kind = e["event"]
    if kind == "step":
        return f"  [{record}] step {e['step']}/{e['last']}  loss {e['loss']:.4f}  {e['seconds']:.2f} s"
    if kind == "save":
        return (f"  [{record}] saved {e['tag']}: rank 0 wrote {len(e['files'])} files, {e['bytes'] / 2**20:.2f} MiB; "
                f"blocking {e['blocking_seconds']:.3f} s, durable {e['durable_seconds']:.3f} s")
    if kind == "mark" and e["name"] in ("engine_initialized", "checkpoint_loaded"):
        return f"  [{record}] {e['name'].replace('_', ' ')}"
    if kind == "verify" and not e["ok"]:  # "verified" is said once every rank is (restart())
        return f"  [{record}] rank 0: restored state MISMATCH in {e['differing_count']} tensors"
    if kind == "error":
        return f"  [{record}] rank 0 error: {e['message']}"
    return None


def launch(run_dir: Path, record: str, timeout: int, cleanup: list[Path] | None = None) -> dict:
    """Run launch-<record>.sh, logging its output and showing rank 0's progress; kill it on timeout. `cleanup`:
    folders the watchdog removes if the harness dies while the ranks run (a staged environment)."""
    log_path = run_dir / "logs" / f"{record}.log"
    log_path.parent.mkdir(exist_ok=True)
    events = run_dir / "events" / record / "rank-00000.jsonl"
    load = machine.load_now()  # before the ranks start: other work on the machine, not ours
    if load["busy"]:
        say(f"  [{record}] machine busy before the launch: {load['cpu_busy_fraction']:.0%} of its {load['cpus']} "
            "CPUs in use by other work; timings and the prediction are suspect")
    start = time.time()
    with open(log_path, "wb") as log:
        command = [*strace.wrapper(run_dir, record), "bash", str(run_dir / f"launch-{record}.sh")]
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        watchdog = _watchdog(proc.pid, cleanup or [])
        try:
            timed_out = _follow(proc, events, record, start, timeout)
        except BaseException:
            # the harness is going away (Ctrl-C, SIGTERM, an exception): take the ranks with it
            session.kill(proc.pid)
            proc.wait()
            raise
        finally:
            watchdog.kill()
            watchdog.wait()
    result = {"record": record, "start": start, "wall_seconds": round(time.time() - start, 3),
              "exit_code": proc.returncode, "timed_out": timed_out, "log": str(log_path.relative_to(run_dir)),
              "machine_load": load}
    (run_dir / "records").mkdir(exist_ok=True)
    return result


def _watchdog(sid: int, cleanup: list[Path]) -> subprocess.Popen:
    """A harness killed outright (SIGKILL, OOM killer) cannot end its launch; this small process does, so no rank
    outlives the harness. Launchers do not reliably pass a SIGTERM on (DeepSpeed's runner leaves its ranks)."""
    return subprocess.Popen([sys.executable, "-m", "restart_harness.launch.session", str(sid), str(os.getpid()),
                             *map(str, cleanup)],
                            start_new_session=True, cwd=SOURCE_ROOT)


def _follow(proc: subprocess.Popen, events: Path, record: str, start: float, timeout: int) -> bool:
    """Show rank 0's progress until the launch ends; SIGKILL its process group after `timeout` s (-> True)."""
    offset = 0
    while True:
        try:
            proc.wait(timeout=0.5)
            done = True
        except subprocess.TimeoutExpired:
            done = False
        lines, offset = _new_lines(events, offset)
        for e in lines:
            if msg := _progress_line(record, e):
                say(msg)
        if done:
            return False
        if time.time() - start > timeout:
            session.kill(proc.pid)
            proc.wait()
            return True


def _save_record(run_dir: Path, info: dict) -> None:
    write_json_atomic(run_dir / "records" / f"{info['record']}.json", info)


def _failure(run_dir: Path, info: dict) -> str:
    from restart_harness.results import events as ev
    from restart_harness.results import placement

    record = ev.read_record(run_dir, info["record"])
    errors = ev.errors(record)
    if info["timed_out"]:
        return f"{info['record']} phase timed out after {info['wall_seconds']:.0f} s (timeout=); process group killed"
    log = run_dir / info["log"]
    spec = resolved.read(run_dir, info["record"]).spec
    verdicts = launchers.of(spec).task_verdicts(log.read_text(errors="replace")) if log.is_file() else {}
    lost = placement.lost(record, spec.launched_ranks, verdicts)
    if lost and (not errors or any(v != placement.COLLATERAL for v in verdicts.values())):
        # the launcher says ranks were killed (a node lost): they came first, the others' errors (a peer gone) after
        also = f"; the others' first error: {errors[0]}" if errors else ""
        return f"{info['record']} phase failed: {lost}{also} (exit code {info['exit_code']}; see {log})"
    if errors:
        return f"{info['record']} phase failed: {errors[0]}" + (f"; {lost}" if lost else "")
    return f"{info['record']} phase exited with code {info['exit_code']}; see {run_dir / info['log']}"


# parameters a rank from which a bf16 step on a CPU without AVX-512 takes seconds (`small`, 56 M a rank at dp=2: 70 s;
# `tiny`, 0.25 M: 0.13 s) and the run is told so
SLOW_BF16_PARAMETERS = 10_000_000


def run(spec: RunSpec, prefix: str = "") -> Path:
    """Prepare, then: dry_run -> print what was written; a scheduler's launcher -> submit the job; else execute
    here."""
    run_dir = prepare(spec, prefix).run_dir
    launcher = launchers.of(spec)
    if spec.across_nodes and spec.ranks_per_node % spec.tp and not spec.emulate:
        # allowed, as DeepSpeed and Megatron allow it, but no one means it: said once, before anything starts
        say(f"warning: tp={spec.tp} with ranks_per_node={spec.ranks_per_node}: tensor-parallel groups span nodes, so "
            "every layer's all-reduces cross the network (training steps slow down; the checkpoint's files are the "
            "same)")
    if (spec.device == "cpu" and spec.precision == "bf16" and not spec.emulate and not launcher.submits()
            and spec.shape.num_parameters() / (spec.tp * spec.pp) >= SLOW_BF16_PARAMETERS
            and machine.bf16_matmul_is_slow()):
        say("warning: precision=bf16 on a CPU without AVX-512: torch's bf16 matrix products run here about 15-60x "
            "slower than fp32 (measured: docs/measurements.md#bf16-on-cpu), so at this size training steps dominate "
            "the run; precision=fp32 keeps them short (the checkpoint then holds fp32 weights)")
    if spec.dry_run:
        set_status(run_dir, "dry_run", "dry_run=true: written, nothing launched")
        if launcher.scheduler:
            write_job_script(spec, run_dir)
        show_generated(run_dir)
        show_node_checks(spec)
        return run_dir
    if launcher.submits():
        script = write_job_script(spec, run_dir)
        job_id = launcher.submit(script)
        job = {"scheduler": spec.launcher, "job_id": job_id, "script": script.name, "submitted": time.time()}
        write_json_atomic(run_dir / "job.json", job)
        set_status(run_dir, "submitted", None, scheduler=spec.launcher, job_id=job_id)
        say(f"run {run_dir.name}: submitted {script.name} to {spec.launcher} as job {job_id}")
        print(f"job {job_id}")
        if spec.wait:
            wait_for_job(run_dir, launcher, job_id)
        return run_dir
    return execute(run_dir)


def show_node_checks(spec: RunSpec) -> None:
    """dry_run=true: what the node that runs the ranks is checked for, and where (launch/nodecheck.py)."""
    checks = nodecheck.checks(spec)
    where = ("on every node of the job, before any rank starts" if launchers.of(spec).scheduler else
             "on this machine, before anything is created, when the run is launched")
    print(f"==> checks of the node that runs the ranks ({where}) <==")
    for check in checks:
        print(f"{check.name}: {check.what}")
    if not checks:
        print("(none for this engine and device)")


def check_nodes(spec: RunSpec, run_dir: Path) -> None:
    """Inside a submitted job, or across the nodes of an allocation: the node checks once on every node before
    anything starts (launch/nodecheck.py); RunFailed naming the first node that fails. A launch that starts its ranks
    on the machine the command was typed on was checked there (preflight)."""
    if not (launchers.job_id() or spec.across_nodes) or not nodecheck.checks(spec):
        return
    argv = [sys.executable, "-m", "restart_harness.launch.nodecheck", str(run_dir)]
    command = launchers.of(spec).per_node_command(argv) or argv
    proc, nodes = _one_record_a_node(command, timeout=600)
    (run_dir / "records").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "records" / "nodecheck.json", {"command": command, "exit_code": proc.returncode,
                                                               "nodes": nodes})
    if failed := nodecheck.line(spec, nodes):
        raise RunFailed(failed)
    expected = spec.nodes if spec.across_nodes else 1
    if proc.returncode != 0 or len(nodes) != expected:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        raise RunFailed(f"the node checks did not run on every node ({len(nodes)} of {expected} answered; "
                        f"{command[0]} exit {proc.returncode}: {said})")
    say(f"  [nodes] {', '.join(n['host'] for n in nodes)}: {', '.join(nodes[0]['checks'])} checked, every one passed")


def wait_for_job(run_dir: Path, launcher, job_id: str, poll_seconds: float = 2.0) -> None:
    """wait=true: follow a submitted job until it ends (its state, rank 0's progress of each phase); returns once the
    run is complete, else RunFailed with the run's own one-line reason. Ctrl-C stops the waiting, not the job."""
    from restart_harness.results.status import observed

    say(f"  waiting for job {job_id} (wait=true; Ctrl-C stops waiting, the job goes on)")
    last, offsets = "", {}
    while True:
        state = launcher.job_state(job_id)
        if (state or "ended") != last:
            last = state or "ended"
            say(f"  [job {job_id}] {last.lower()}")
        for events in sorted((run_dir / "events").glob("*/rank-00000.jsonl")):
            record = events.parent.name
            lines, offsets[record] = _new_lines(events, offsets.get(record, 0))
            for e in lines:
                if msg := _progress_line(record, e):
                    say(msg)
        if state is None or state in launcher.ended_states:
            break
        time.sleep(poll_seconds)
    status = observed(run_dir)
    if status["state"] == "complete":
        return
    if status["state"] in ("submitted", "running"):
        raise RunFailed(f"job {job_id} ended ({last.lower()}) without finishing the run; its log: "
                        f"{run_dir / 'logs'}")
    raise RunFailed(status.get("reason") or f"job {job_id} ended, run {status['state']}")


def _new_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines written to path since byte `offset`, and the offset after them."""
    if not path.is_file():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.decode().splitlines()], offset + len(complete)


def write_job_script(spec: RunSpec, run_dir: Path, job_args: list[str] | None = None) -> Path:
    launcher = launchers.of(spec)
    (run_dir / "logs").mkdir(exist_ok=True)  # the scheduler writes the job's output there
    write_text_atomic(run_dir / launcher.script_name, launcher.job_script(run_dir, job_args), mode=0o755)
    return run_dir / launcher.script_name


def show_generated(run_dir: Path) -> None:
    """Print every generated file (dry_run=true)."""
    for path in [run_dir / "ds_config.json", *sorted(run_dir.glob("launch-*.sh")), *sorted(run_dir.glob("job.*"))]:
        print(f"==> {path} <==")
        print(path.read_text().rstrip())


def execute(run_dir: Path) -> Path:
    """checkpoint phase -> cache state -> restart phase -> summary, from the run directory prepare() wrote."""
    run = resolved.read(run_dir)
    spec = machine.complete_in_job(run.spec)  # submitted: this (compute) node decides what was left to it
    if spec != run.spec:
        run = dataclasses.replace(run, spec=spec)
        run.write()
        port = spec.master_port or free_port()
        for phase, record in (("checkpoint", "checkpoint"), ("restart", "restart-01"))[:2 if spec.phase == "all" else 1]:
            write_launch(run, phase, record, port)
    set_status(run_dir, "running", **_job_fields())
    subset = f", subset: the first {spec.launched_ranks}" if spec.subset else ""
    say(f"run {run_dir.name}: {spec.model_label}, {spec.layout} ({spec.world_size} ranks{subset}, {spec.device}), "
        f"engine {spec.engine}, {spec.precision}, launcher {spec.launcher}")
    target = targets.for_run(run)
    try:
        check_nodes(spec, run_dir)
        probe = record_baseline(run, target)
        if probe:
            say(f"  [baseline] {probe.get('error') or _baseline_line(probe)}")
        made = record_prediction(run, probe)
        if made:
            say(f"  [predict] {made}")
        say(f"  [checkpoint] launching {spec.launched_ranks} ranks (log: {run_dir / 'logs' / 'checkpoint.log'})")
        info = launch(run_dir, "checkpoint", spec.timeout)
        info["incomplete_uploads"] = abort_incomplete_uploads(target, "checkpoint")
        _save_record(run_dir, info)
        if info["exit_code"] != 0:
            raise RunFailed(_failure(run_dir, info))
        if spec.phase == "all" and registry.get(spec.engine).saves:
            integrity = whole_checkpoint(run, target)
            record = allocate_record(run_dir)
            if record != "restart-01":  # someone forced a restart-only re-run meanwhile: never share a record
                write_launch(run, "restart", record, spec.master_port or free_port())
            restart(run, target, spec, record, extra={"integrity": integrity} if integrity else None)
        summary = finalize.finalize(run_dir, state="complete")
    except RunFailed as exc:
        finalize.finalize(run_dir, state="failed", reason=str(exc))
        raise
    except KeyboardInterrupt:
        finalize.finalize(run_dir, state="failed", reason="interrupted")
        raise
    if summary["status"]["state"] != "complete":  # a restart that verified on every rank, but not its first loss
        raise RunFailed(summary["status"]["reason"])
    if not spec.keep:
        discard_checkpoint(run_dir, target)
    return run_dir


def whole_checkpoint(run: resolved.ResolvedRun, target) -> dict | None:
    """Before the restart of phase=all: the committed checkpoint's files are the ones its save recorded (bytes, and
    content where it recorded checksums), as a restart-only re-run checks before it launches."""
    from restart_harness import preflight

    try:
        tag, integrity = preflight.committed_checkpoint(run, target)
    except UsageError as exc:
        raise RunFailed(f"the committed checkpoint is not whole: {exc}") from None
    if integrity:
        say(f"  {integrity_line(tag, integrity)}")
    return integrity


def integrity_line(tag: str, integrity: dict) -> str:
    return (f"[checksums] {tag}: {integrity['files']} files, {integrity['bytes'] / 2**20:.2f} MiB read back, every "
            f"{integrity['algorithm']} as recorded at commit ({integrity['seconds']:.2f} s)")


def abort_incomplete_uploads(target, record: str) -> dict | None:
    """After a checkpoint phase, and before a restart-only re-run: uploads a failed save left unfinished, aborted (or
    why they could not be), said in one line when there were any."""
    found = target.abort_incomplete_uploads()
    if found and found["aborted"]:
        say(f"  [{record}] aborted {len(found['aborted'])} incomplete multipart uploads under {target.describe()} "
            f"left by a failed save ({', '.join(found['aborted'][:3])}{', ...' if len(found['aborted']) > 3 else ''})")
    if found and found["error"]:
        say(f"  [{record}] could not list or abort incomplete multipart uploads under {target.describe()}: "
            f"{found['error']}; a restart-only re-run (restart run=) tries again")
    return found


def record_baseline(run: resolved.ResolvedRun, target) -> dict | None:
    """Before the checkpoint phase: the baseline of the checkpoint storage (cached, or a bounded probe at the
    planned checkpoint's typical file size and rank count) into run_dir/baseline.json; None with baseline=false."""
    spec = run.spec
    if not spec.baseline or not registry.get(spec.engine).saves:
        return None
    from restart_harness.plan import checkpoint, estimate

    record = baseline.for_run(target, estimate.typical_file_bytes(checkpoint.files(spec)), spec.launched_ranks,
                              spec.baseline_max_age_hours * 3600)
    write_json_atomic(run.run_dir / "baseline.json", record)
    return record


def record_prediction(run: resolved.ResolvedRun, probe: dict | None) -> str | None:
    """Before the checkpoint phase: what the calibration in force predicts for this run, into prediction.json (the
    summary sets it beside what is measured); one line for the terminal. None where the planner cannot plan it."""
    from restart_harness.predict import forecast
    from restart_harness.results import prediction as pr

    spec = run.spec
    if not stacks.of(spec).planned:
        return None
    try:
        store = forecast.storage(spec, record=probe if probe and not probe.get("error") else None)
        made = forecast.build(spec, (run.facts.get("host") or {}).get("cpus") or 1, store)
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop a run; its failure is recorded instead
        made = {"error": f"{type(exc).__name__}: {exc}"}
    write_json_atomic(run.run_dir / pr.FILE, made)
    if made.get("error"):
        return f"no prediction: {made['error']}"
    p = made["phases"]
    shown = (("durable save", "save_durable_seconds"), ("restart with launcher", pr.TOTAL))
    parts = [f"{label} {p[name]['seconds']:.2f} s" for label, name in shown if p[name].get("seconds") is not None]
    whole = forecast.run_wall_seconds(spec, made)
    if whole is not None:
        parts.append(f"the whole run about {duration(whole)}")
    return f"calibration {spec.calibration}: " + (", ".join(parts) or "nothing predicted (see prediction.json)")


def _baseline_line(b: dict) -> str:
    age = f"(cached, {b['age_seconds'] / 3600:.1f} h old) " if b["cached"] and b.get("age_seconds") is not None else ""
    return (f"storage {age}write {b['write_mib_s']} MiB/s, read {b['read_mib_s']} MiB/s "
            f"({b['method']}, {b['ranks']} x {b['file_bytes']} bytes)")


def _job_fields() -> dict:
    job = launchers.job_id()
    return {"job_id": job} if job else {}


def discard_checkpoint(run_dir: Path, target) -> None:
    """keep=false: delete the checkpoint after the results are written (summary.json already describes it)."""
    say(f"  keep=false: deleted {target.delete()}")
    status = json.loads((run_dir / "status.json").read_text())
    write_json_atomic(run_dir / "status.json", {**status, "checkpoint_deleted": True})


def _one_record_a_node(command: list[str], timeout: int) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run a per-node command (one task a node, each printing one JSON record); the process and the records it
    printed (lines that are not JSON, such as a launcher's own messages, are passed over)."""
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout, cwd=SOURCE_ROOT)
    nodes = []
    for line in proc.stdout.splitlines():
        try:
            nodes.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return proc, nodes


def cache_on_every_node(spec: RunSpec, load_dir: Path, per_file: bool = False) -> dict:
    """The cache step on each node of a multi-node job (one task per node): {"per_node": [its record with its
    host], "observed": the worst node's}, or an error saying why it could not run (observed then stays this
    node's, and says so). `per_file`: each node evicts the checkpoint's files alone, as this node did."""
    argv = [sys.executable, "-m", "restart_harness.storage.pagecache", spec.cache, str(load_dir),
            *(["--per-file"] if per_file else [])]
    command = launchers.of(spec).per_node_command(argv)
    if command is None:
        return {}
    proc, nodes = _one_record_a_node(command, timeout=300)
    if proc.returncode != 0 or len(nodes) != spec.nodes:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return {"per_node": nodes or None,
                "error": f"the cache step on every node failed ({command[0]} exit {proc.returncode}: {said}); "
                         "observed is the first node's only"}
    nodes.sort(key=lambda n: n["host"])
    not_cold = [n for n in nodes if n["observed"] != "cold"]
    observed = "cold" if not not_cold else "; ".join(f"{n['host']} {n['observed']}" for n in not_cold)
    if spec.cache == "warm":
        observed = "warm" if all(n["observed"] == "warm" for n in nodes) else "; ".join(
            f"{n['host']} {n['observed']}" for n in nodes if n["observed"] != "warm")
    return {"per_node": nodes, "observed": observed}


def restart(run: resolved.ResolvedRun, target, spec: RunSpec, record: str,
            relayout: stacks.Relayout | None = None, extra: dict | None = None) -> dict:
    """One restart launch of a prepared record; `relayout`: how a restart at another layout reads the checkpoint
    (what it loads, whose pages the cache step acts on); `extra`: facts for its record (the layouts, the
    conversion). With env_stage=, the environment's copy is made first (the cache steps then act on it) and removed
    when the restart ends."""
    tag = target.latest()
    if tag is None:
        raise RunFailed(f"no committed checkpoint in {target.describe()} (no 'latest'): nothing to restart from")
    load_dir = relayout.load_dir if relayout and relayout.load_dir else target.path(tag)
    staged = None
    if spec.env_stage is not None:
        say(f"  [{record}] staging the environment into {spec.env_stage}")
        staged = staging.stage(spec.env_stage, f"{run.run_dir.name}-{record}")
    try:
        if staged is not None:
            write_launch(run, "restart", record, spec.master_port or free_port(),
                         relayout.worker_args() if relayout is not None else None, spec=spec, staged=staged)
            st = staged.record
            say(f"  [{record}] staged {st['files']:,} files, {st['bytes'] / 2**30:.2f} GiB in {st['seconds']:.1f} s "
                f"({st['filesystem']['type']} on {st['filesystem']['mount']})")
        return _launch_restart(run, target, spec, record, load_dir, staged, extra)
    finally:
        staging.remove(staged)


def _launch_restart(run: resolved.ResolvedRun, target, spec: RunSpec, record: str, load_dir: Path,
                    staged: staging.Staged | None, extra: dict | None) -> dict:
    """The cache steps (the checkpoint's, the environment's), the launch, its record and its verification."""
    # env_cache=warm or keep leaves the environment's pages: the checkpoint's are then evicted file by file;
    # env_cache=drop with cache=warm keeps the checkpoint's: the environment's likewise
    per_file = spec.env_cache in ("warm", "keep")
    state = target.prepare_cache(load_dir, spec.cache, per_file=per_file)
    if spec.across_nodes and state.get("method") is not None:  # a node's page cache is its own: every node's
        state = {**state, **cache_on_every_node(spec, load_dir, per_file)}
    say(f"  [{record}] page cache: asked {state['requested']}, observed {state['observed']}"
        + (f" ({state['error']})" if state["error"] else ""))
    env_state = pagecache.environment(observe.environment_files_prefixes(run.run_dir, run.checkpoint_root, staged),
                                      spec.env_cache, state, per_file=spec.cache == "warm")
    if spec.across_nodes and spec.env_cache not in ("auto", "keep"):
        env_state["nodes"] = "this node only"  # the other nodes' environments are as the checkpoint's step left them
    if env_state["observed"] is not None:
        say(f"  [{record}] environment's page cache: asked {env_state['requested']}, observed {env_state['observed']}"
            f" ({env_state['libraries']} shared libraries, {env_state['bytes'] / 2**30:.2f} GiB)"
            + (f" ({env_state['error']})" if env_state["error"] else ""))
    say(f"  [{record}] launching {spec.launched_ranks} fresh ranks")
    info = launch(run.run_dir, record, spec.timeout, cleanup=[staged.folder] if staged else None)
    info.update(cache=state, environment_cache=env_state, launcher=spec.launcher, **(extra or {}))
    if staged is not None:
        info["staging"] = staged.record
    _save_record(run.run_dir, info)
    if info["exit_code"] != 0:
        raise RunFailed(_failure(run.run_dir, info))
    from restart_harness.results import events as ev

    failed, tensors = ev.verification(ev.read_record(run.run_dir, record), spec.launched_ranks)
    if failed:
        raise RunFailed(f"{record}: restart did not restore the saved state: {', '.join(failed[:5])}")
    say(f"  [{record}] restored state verified on every rank ({spec.launched_ranks} ranks, {tensors} tensors)")
    return info


def restart_only(request) -> Path:
    """phase=restart: `repeats` more restarts of an existing run, each its own record; then finalize again.

    The run's state stays what its checkpoint phase made it (a run whose checkpoint phase failed stays failed,
    a crashed one becomes failed with that reason); a failing re-run marks the run failed with its reason."""
    from restart_harness.results.status import observed

    run, spec = request.run, request.spec
    run_dir = run.run_dir
    if launchers.of(spec).submits():
        return submit_restart_job(request)
    spec = machine.complete_in_job(spec)  # a layout of its own: its threads per rank
    prior = observed(run_dir)
    state, reason = ("complete", None) if prior["state"] == "complete" else ("failed", prior.get("reason"))
    target = targets.for_run(run)
    tag = target.latest()
    layouts = {"saved": request.original.layout, "loaded": spec.layout}
    say(f"run {run_dir.name}: {request.repeats} restart(s) of {spec.model_label} from {tag}, saved at "
        f"{layouts['saved']}, loaded at {spec.layout}; launcher {spec.launcher}, cache={spec.cache}")
    try:
        check_nodes(spec, run_dir)  # inside a restart job: its nodes, with the run's engine and device
        relayout, facts = None, {"layout": layouts}
        if request.integrity:
            facts["integrity"] = request.integrity
            say(f"  {integrity_line(tag, request.integrity)}")
        if (uploads := abort_incomplete_uploads(target, "setup")) is not None:
            facts["incomplete_uploads"] = uploads
        if request.relayout:
            relayout = stacks.of(spec).relayout(dataclasses.replace(run, spec=spec), request.original, tag, say)
            if relayout.conversion:
                facts["conversion"] = relayout.conversion
        launched = []
        for n in range(request.repeats):
            record = allocate_record(run_dir)
            launched.append(record)
            run.write_record_spec(record, spec)  # the restart's own settings (layout, anatomy, launcher, ...)
            args = []
            if relayout is not None:
                config = deep_merge(build_ds_config(spec), relayout.ds_config)
                write_json_atomic(run_dir / "records" / f"ds_config-{record}.json", config)
                args = relayout.worker_args()
            write_launch(run, "restart", record, spec.master_port or free_port(), args, spec=spec)
            say(f"  restart {n + 1}/{request.repeats}: record {record}")
            restart(run, target, spec, record, relayout, facts)
    except RunFailed as exc:
        finalize.finalize(run_dir, state="failed", reason=str(exc))
        raise
    except KeyboardInterrupt:
        finalize.finalize(run_dir, state="failed", reason="interrupted during a restart-only re-run")
        raise
    summary = finalize.finalize(run_dir, state=state, reason=reason)
    failed = [r for r in summary["restarts"] if r["record"] in launched and not r["verified"]]
    if failed:  # each verified on every rank, but a first loss at another layout did not continue the run's
        raise RunFailed(f"{failed[-1]['record']}: restart did not restore the saved state: "
                        + ", ".join(failed[-1]["differing"][:5]))
    if not spec.keep:
        discard_checkpoint(run_dir, target)
    return run_dir


def submit_restart_job(request) -> Path:
    """phase=restart with a scheduler's launcher (slurm, pbs) from outside an allocation: a batch job of its own runs the restarts
    (records are claimed inside the job, when each restart starts). Writes job-restart-N.<ext> and its .json."""
    run_dir, spec = request.run_dir, request.spec
    for n in range(1, 10000):
        claim = run_dir / f"job-restart-{n}.json"
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # exclusive: concurrent submissions
            break
        except FileExistsError:
            continue
    launcher = launchers.of(spec)
    script = run_dir / launcher.script_name.replace("job.", f"job-restart-{n}.")
    write_text_atomic(script, launcher.job_script(run_dir, ["phase=restart", *request.tokens]), mode=0o755)
    job_id = launcher.submit(script)
    write_json_atomic(claim, {"scheduler": spec.launcher, "job_id": job_id, "script": script.name,
                              "submitted": time.time(), "phase": "restart", "args": request.tokens})
    say(f"run {run_dir.name}: submitted {script.name} ({request.repeats} restart(s)) to {spec.launcher} "
        f"as job {job_id}")
    print(f"job {job_id}")
    return run_dir
