"""One launch of a phase's ranks: the launch script run in a session of its own, its output logged, rank 0's
progress shown, a watchdog that ends it if the harness dies, a time limit, and every wait after a signal bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from restart_harness import SOURCE_ROOT, machine
from restart_harness.files.cache_dir import extensions_dir
from restart_harness.files.kernel_memory import OomWatch
from restart_harness.iocount import strace
from restart_harness.phases import say, session
from restart_harness.rundir import sampling
from restart_harness.spec import environment
from third_party.py_spy_stuck_tracee import VERSION as VERSION_STUCK

# after a signal, how long the harness waits for its launch's session to end once killed
KILLED_WAIT_SECONDS = 10
# attribution=: how long the sampler may take to write its trace and exit once the launch it wraps has ended; then it
# is killed and the launch's samples are lost (under load py-spy once held a finished run 5.5 minutes)
SAMPLER_GRACE_SECONDS = 60


def launch_of(run, record: str, cleanup: list[Path] | None = None) -> dict:
    """launch() of a run's record, sampled where attribution= asks for it and the sampler can see the ranks; the
    record says which (`attribution`; preflight.attribution said why not)."""
    spec = run.spec
    sampler, refused = sampling.of_launch(spec, run.launcher, run.run_dir, record)
    info = launch(run.run_dir, record, spec.timeout, cleanup, sampler)
    if sampler is not None or refused:
        info["attribution"] = sampler.record(spec.attribution) if sampler else refused
    return info


def launch(run_dir: Path, record: str, timeout: int, cleanup: list[Path] | None = None, sampler=None) -> dict:
    """Run launch-<record>.sh, logging its output and showing rank 0's progress; kill it on timeout. `cleanup`:
    folders the watchdog removes if the harness dies while the ranks run (a staged environment); `sampler`: the
    launch runs under it (attribution=, rundir/sampling.py)."""
    log_path = run_dir / "logs" / f"{record}.log"
    log_path.parent.mkdir(exist_ok=True)
    events = run_dir / "events" / record / "rank-00000.jsonl"
    load = machine.load_now()  # before the ranks start: other work on the machine, not ours
    if load["busy"]:
        say(f"  [{record}] machine busy before the launch: {load['cpu_busy_fraction']:.0%} of its {load['cpus']} "
            "CPUs in use by other work; timings and the prediction are suspect")
    start, mark = time.time(), machine.load_mark()
    oom = OomWatch()  # a rank the kernel kills for memory is named as the cause of a failure (phases/diagnose.py)
    with open(log_path, "wb") as log:
        traced = strace.wrapper(run_dir, record, environment.read().RH_STRACE)
        command = [*traced, "bash", str(run_dir / f"launch-{record}.sh")]
        env = None
        if sampler is not None:
            command, env = sampler.command(command), {**os.environ, **sampler.environment()}
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        watchdog = _watchdog(proc.pid, cleanup or [])
        try:
            timed_out = _follow(proc, events, record, start, timeout, sampler)
        except BaseException:
            # the harness is going away (Ctrl-C, SIGTERM, an exception): take the ranks with it
            end(proc)
            _orphaned_locks(proc, record, start)
            raise
        finally:
            watchdog.kill()
            _bounded_wait(watchdog)
    if timed_out or proc.returncode:
        _orphaned_locks(proc, record, start)
    killed = oom.result()
    return {"record": record, "start": start, "wall_seconds": round(time.time() - start, 3),
            "exit_code": sampler.exit_code(proc.returncode) if sampler else proc.returncode, "timed_out": timed_out,
            "log": str(log_path.relative_to(run_dir)),
            "machine_load": {**load, "during": machine.load_since(mark)}} | ({"oom": killed} if killed else {})


def end(proc: subprocess.Popen) -> None:
    """Kill a launch's whole session and wait for it, within KILLED_WAIT_SECONDS."""
    session.kill(proc.pid)
    _bounded_wait(proc)


def _bounded_wait(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=KILLED_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass  # a zombie's parent is this process: it is reaped when the harness exits


def _orphaned_locks(proc: subprocess.Popen, record: str, since: float) -> None:
    """A rank killed while it built an op leaves the build's lock, on which every other run waits (third_party);
    once the launch's processes are gone, a lock made since its start that nothing holds is that."""
    from third_party.torch_extension_lock import remove_orphaned

    session.gone(proc.pid, KILLED_WAIT_SECONDS)
    for lock in remove_orphaned(extensions_dir(), since):
        say(f"  [{record}] removed {lock}: the lock of a JIT build this launch's ranks left unfinished")


def _watchdog(sid: int, cleanup: list[Path]) -> subprocess.Popen:
    """A harness killed outright (SIGKILL, OOM killer) cannot end its launch; this small process does, so no rank
    outlives the harness. Launchers do not reliably pass a SIGTERM on (DeepSpeed's runner leaves its ranks)."""
    return subprocess.Popen([sys.executable, "-m", "restart_harness.phases.session", str(sid), str(os.getpid()),
                             *map(str, cleanup)],
                            start_new_session=True, cwd=SOURCE_ROOT)


def _follow(proc: subprocess.Popen, events: Path, record: str, start: float, timeout: int, sampler=None) -> bool:
    """Show rank 0's progress until the launch ends (and any op the launch builds first); SIGKILL its process group
    after `timeout` s (-> True). A sampler that holds a rank traced after it exited is ended, and the launch waited
    for without it (third_party/py_spy_stuck_tracee.py); one still running SAMPLER_GRACE_SECONDS after the launch
    it wraps ended is killed: every wait on the sampler is bounded."""
    offset, built = 0, set()
    watch = sampler.watch(proc.pid) if sampler is not None else None
    ended = None  # when the launch the sampler wraps ended (its exit code written)
    while True:
        try:
            proc.wait(timeout=0.5)
            done = True
        except subprocess.TimeoutExpired:
            done = False
        lines, offset = new_lines(events, offset)
        for e in lines:
            if msg := progress_line(record, e):
                say(msg)
        _building(record, built, start)
        if watch is not None and not done and (pid := watch.stuck(session.members(proc.pid))):
            sampler.lost = (f"py-spy {VERSION_STUCK} held rank process {pid} traced after it exited (its launcher "
                            "could not reap it); the sampler was ended and this launch's samples are lost")
            say(f"  [{record}] {sampler.lost}")
            watch = None
            os.kill(proc.pid, signal.SIGKILL)  # its tracees are released as it exits
            _bounded_wait(proc)
            session.gone(proc.pid, max(1, timeout - (time.time() - start)))  # the launch ends by itself
            return False
        if done:
            return False
        if sampler is not None and (ended := ended or (time.time() if sampler.exit_file.is_file() else None)) \
                and time.time() - ended > SAMPLER_GRACE_SECONDS:
            sampler.lost = (f"the sampler (py-spy) had not ended {SAMPLER_GRACE_SECONDS} s after the launch ended; it "
                            "was killed and this launch's samples are lost")
            say(f"  [{record}] {sampler.lost}")
            end(proc)
            return False
        if time.time() - start > timeout:
            end(proc)
            return True


def _building(record: str, said: set, since: float) -> None:
    """Say each op torch starts building in this environment while the launch runs (once): its JIT builder holds a
    lock in the op's folder of the extension cache while it compiles (minutes on a few cores, once per environment;
    ranks that need the op wait for it), when the terminal would otherwise show nothing after "launching"."""
    for lock in extensions_dir().glob("*/lock"):
        try:
            fresh = lock.stat().st_mtime >= since - 1
        except OSError:  # the build ended meanwhile
            continue
        if fresh and lock.parent.name not in said:
            said.add(lock.parent.name)
            say(f"  [{record}] DeepSpeed's {lock.parent.name} op is being built for this environment (its first use: "
                "about a minute on 2 cores; cached for every later run)")


def progress_line(record: str, e: dict) -> str | None:
    """One line of rank 0's progress for an event, or None for events not shown."""
    kind = e["event"]
    if kind == "step":
        return f"  [{record}] step {e['step']}/{e['last']}  loss {e['loss']:.4f}  {e['seconds']:.2f} s"
    if kind == "save":
        return (f"  [{record}] saved {e['tag']}: rank 0 wrote {len(e['files'])} files, {e['bytes'] / 2**20:.2f} MiB; "
                f"blocking {e['blocking_seconds']:.3f} s, durable {e['durable_seconds']:.3f} s")
    if kind == "mark" and e["name"] in ("engine_initialized", "checkpoint_loaded"):
        return f"  [{record}] {e['name'].replace('_', ' ')}"
    if kind == "verify" and not e["ok"]:  # "verified" is said once every rank is (phases/restart.py)
        return f"  [{record}] rank 0: restored state MISMATCH in {e['differing_count']} tensors"
    if kind == "error":
        return f"  [{record}] rank 0 error: {e['message']}"
    return None


def new_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines written to path since byte `offset`, and the offset after them."""
    if not path.is_file():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.decode().splitlines()], offset + len(complete)


def one_record_a_node(command: list[str], timeout: int) -> tuple[subprocess.CompletedProcess, list[dict]]:
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
