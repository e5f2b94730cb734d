"""One launch of a phase's ranks: the launch script run in a session of its own, its output logged, rank 0's
progress shown, a watchdog that ends it if the harness dies, a time limit, and every wait after a signal bounded;
why a launch failed, in one line; and the work done once on every node of a launch (the node checks, the page-cache
step before a restart)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from restart_harness import SOURCE_ROOT, launchers, machine, nodecheck, resolve
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic
from restart_harness.files.cache_dir import extensions_dir
from restart_harness.files.kernel_memory import OomWatch
from restart_harness.iocount import strace
from restart_harness.phases import say, session
from restart_harness.results import events as ev
from restart_harness.results import placement
from restart_harness.rundir import sampling
from restart_harness.spec import environment
from third_party.py_spy_stuck_tracee import VERSION as VERSION_STUCK

# after a signal, how long the harness waits for its launch's session to end once killed
KILLED_WAIT_SECONDS = 10
# attribution=: how long the sampler may take to exit once the launch it wraps has ended, before it is killed
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
    folders the watchdog removes if the harness dies; `sampler`: the launch runs under it (attribution=)."""
    log_path = run_dir / "logs" / f"{record}.log"
    log_path.parent.mkdir(exist_ok=True)
    load = machine.load_now()  # before the ranks start: other work on the machine, not ours
    if load["busy"]:
        say(f"  [{record}] machine busy before the launch: {load['cpu_busy_fraction']:.0%} of its {load['cpus']} "
            "CPUs in use by other work; timings and the prediction are suspect")
    start, mark = time.time(), machine.load_mark()
    oom = OomWatch()  # a rank the kernel kills for memory is named as the cause of a failure (failure())
    with open(log_path, "wb") as log:
        traced = strace.wrapper(run_dir, record, environment.read().RH_STRACE)
        command = [*traced, "bash", str(run_dir / f"launch-{record}.sh")]
        env = None
        if sampler is not None:
            command, env = sampler.command(command), {**os.environ, **sampler.environment()}
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        # a harness killed outright (SIGKILL, OOM killer) cannot end its launch; this small process does (launchers
        # do not reliably pass a SIGTERM on: DeepSpeed's runner leaves its ranks)
        watchdog = subprocess.Popen([sys.executable, "-m", "restart_harness.phases.session", str(proc.pid),
                                     str(os.getpid()), *map(str, cleanup or [])], start_new_session=True,
                                    cwd=SOURCE_ROOT)
        try:
            timed_out = _follow(proc, run_dir / "events" / record / "rank-00000.jsonl", record, start, timeout, sampler)
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
    with contextlib.suppress(subprocess.TimeoutExpired):  # a zombie is reaped when the harness exits
        proc.wait(timeout=KILLED_WAIT_SECONDS)


def _orphaned_locks(proc: subprocess.Popen, record: str, since: float) -> None:
    """A rank killed while it built an op leaves the build's lock, on which every other run waits (third_party);
    once the launch's processes are gone, a lock made since its start that nothing holds is that."""
    from third_party.torch_extension_lock import remove_orphaned

    session.gone(proc.pid, KILLED_WAIT_SECONDS)
    for lock in remove_orphaned(extensions_dir(), since):
        say(f"  [{record}] removed {lock}: the lock of a JIT build this launch's ranks left unfinished")


def _follow(proc: subprocess.Popen, events: Path, record: str, start: float, timeout: int, sampler=None) -> bool:
    """Show rank 0's progress until the launch ends; SIGKILL its process group after `timeout` s (-> True). A sampler
    that holds an exited rank traced (third_party/py_spy_stuck_tracee.py), or that outlives the launch it wraps by
    SAMPLER_GRACE_SECONDS, is ended: every wait on the sampler is bounded."""
    offset, built = 0, set()
    watch = sampler.watch(proc.pid) if sampler is not None else None
    ended = None  # when the launch the sampler wraps ended (its exit code written)
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        done = proc.returncode is not None
        lines, offset = new_lines(events, offset)
        for e in lines:
            if msg := progress_line(record, e):
                say(msg)
        _building(record, built, start)
        if watch is not None and not done and (pid := watch.stuck(session.members(proc.pid))):
            sampler.lost = (f"py-spy {VERSION_STUCK} held rank process {pid} traced after it exited (its launcher "
                            "could not reap it); the sampler was ended and this launch's samples are lost")
            say(f"  [{record}] {sampler.lost}")
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
    """Say once each op torch starts building while the launch runs (its JIT builder holds a lock in the op's folder
    of the extension cache while it compiles: minutes on a few cores), when the terminal would otherwise be silent."""
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
        with contextlib.suppress(json.JSONDecodeError):
            nodes.append(json.loads(line))
    return proc, nodes


# ---- why a launch failed: a time limit, a rank the kernel's OOM killer ended (its peers' lost connections follow
# from it), ranks the launcher says were killed (a lost node), or the first error a rank recorded, else the exit code
OOM_KILLED = "killed by the kernel's OOM killer"


def failure(run: resolve.Run, info: dict) -> str:
    """One line for a launch (records/<record>.json's info) that did not end with exit code 0."""
    run_dir = run.run_dir
    record = ev.read_record(run_dir, info["record"])
    errors = ev.errors(record)
    if info["timed_out"]:
        return f"{info['record']} phase timed out after {info['wall_seconds']:.0f} s (timeout=); process group killed"
    log = run_dir / info["log"]
    verdicts = run.launcher.task_verdicts(log.read_text(errors="replace")) if log.is_file() else {}
    killed = out_of_memory(record, info.get("oom"), verdicts)  # the OOM killer's ranks' verdicts: OOM_KILLED
    lost = placement.lost(record, run.spec.launched_ranks, verdicts)
    if killed:
        after = "; ".join(x for x in (errors[:1] + [lost or ""]) if x)
        return (f"{info['record']} phase failed: {killed}" + (f"; what the others did after it: {after}" if after
                                                                else "") + f" (exit code {info['exit_code']}; see {log})")
    if lost and (not errors or any(v != placement.COLLATERAL for v in verdicts.values())):
        # the launcher says ranks were killed (a node lost): they came first, the others' errors (a peer gone) after
        also = f"; the others' first error: {errors[0]}" if errors else ""
        return f"{info['record']} phase failed: {lost}{also} (exit code {info['exit_code']}; see {log})"
    if errors:
        return f"{info['record']} phase failed: {errors[0]}" + (f"; {lost}" if lost else "")
    return f"{info['record']} phase exited with code {info['exit_code']}; see {run_dir / info['log']}"


def out_of_memory(record: dict[int, list[dict]], oom: dict | None, verdicts: dict[int, str]) -> str | None:
    """The ranks the kernel's OOM killer ended during the launch (`oom`: phases/processes.py's OomWatch result), with
    their memory then and the limit they met; those ranks' verdicts become OOM_KILLED. None where no rank was."""
    if not oom:
        return None
    pids = {e["pid"]: rank for rank, evs in record.items() for e in evs if e["event"] == "process"}
    group, total = oom.get("cgroup") or {}, oom.get("machine_memory_bytes")
    parts, others = [], []
    for kill in oom.get("kills") or []:
        rank = pids.get(kill["pid"])
        if kill["cgroup_limit_bytes"] is not None:
            limit = (f"its cgroup {kill['cgroup']} at {_gib(kill['cgroup_usage_bytes'])} of its "
                     f"{_gib(kill['cgroup_limit_bytes'])} limit")
        else:
            limit = f"the machine's {_gib(total)} of memory exhausted" if total else "the machine's memory exhausted"
        if rank is None:  # another process (the machine's OOM killer may end anything): said where ours were
            others.append(f"{kill['process']} (pid {kill['pid']}, {_gib(kill['rss_bytes'])} resident, {limit})")
            continue
        verdicts[rank] = OOM_KILLED
        parts.append(f"rank {rank} (pid {kill['pid']}) {OOM_KILLED} (SIGKILL): {_gib(kill['rss_bytes'])} resident, "
                     f"{limit}")
    if parts:
        return "; ".join(parts)
    before, after = group.get("oom_kills_before"), group.get("oom_kills")
    if before is None or after is None or after <= before:
        return None
    limit = group.get("limit_bytes")
    named = (f"the kernel log names {', '.join(others)}" if others else "the kernel log, which names them, cannot be "
             "read here" if oom.get("kills") is None else "the kernel log names none of them")
    return (f"the kernel's OOM killer ended {after - before} process(es) of this cgroup ({group.get('path')}) during "
            f"the launch (oom_kill {before} -> {after}; {named}): peak {_gib(group.get('peak_bytes'))} of "
            + (f"its {_gib(limit)} limit" if limit else f"the machine's {_gib(total)}"))


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:,.2f} GiB"


# ---- once on every node: the node checks inside a submitted job or across an allocation's nodes (nodecheck.py), and
# the page-cache step before a restart (each node's page cache is its own) ----------------------------------------
def show_node_checks(plugins: resolve.Plugins) -> None:
    """dry_run=true: what the node that runs the ranks is checked for, and where."""
    checks = nodecheck.checks(plugins)
    where = ("on every node of the job, before any rank starts" if plugins.launcher.scheduler else
             "on this machine, before anything is created, when the run is launched")
    print(f"==> checks of the node that runs the ranks ({where}) <==")
    print("\n".join(f"{check.name}: {check.what}" for check in checks) or "(none for this engine and device)")


def check_nodes(run: resolve.Run) -> None:
    """Inside a submitted job, or across the nodes of an allocation: the node checks once on every node before
    anything starts (a launch on this machine was checked in preflight); RunFailed naming the first that fails."""
    spec, run_dir = run.spec, run.run_dir
    if not (launchers.job_id() or spec.across_nodes) or not nodecheck.checks(run):
        return
    argv = [sys.executable, "-m", "restart_harness.nodecheck", str(run_dir)]
    command = run.launcher.per_node_command(argv) or argv
    proc, nodes = one_record_a_node(command, timeout=600)
    (run_dir / "records").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "records" / "nodecheck.json", {"command": command, "exit_code": proc.returncode,
                                                               "nodes": nodes})
    if failed := nodecheck.line(nodes):
        raise RunFailed(failed)
    expected = spec.nodes if spec.across_nodes else 1
    if proc.returncode != 0 or len(nodes) != expected:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        raise RunFailed(f"the node checks did not run on every node ({len(nodes)} of {expected} answered; "
                        f"{command[0]} exit {proc.returncode}: {said})")
    say(f"  [nodes] {', '.join(n['host'] for n in nodes)}: {', '.join(nodes[0]['checks'])} checked, every one passed")


def cache_on_every_node(run: resolve.Run, load_dir: Path, per_file: bool = False) -> dict:
    """The cache step on each node of a multi-node job (one task per node): {"per_node": [records], "observed": the
    nodes not as asked}, or an error saying why it could not run. `per_file`: as this node did."""
    spec = run.spec
    argv = [sys.executable, "-m", "restart_harness.files.pagecache", spec.cache, str(load_dir),
            *(["--per-file"] if per_file else [])]
    command = run.launcher.per_node_command(argv)
    if command is None:
        return {}
    proc, nodes = one_record_a_node(command, timeout=300)
    if proc.returncode != 0 or len(nodes) != spec.nodes:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return {"per_node": nodes or None,
                "error": f"the cache step on every node failed ({command[0]} exit {proc.returncode}: {said}); "
                         "observed is the first node's only"}
    nodes.sort(key=lambda n: n["host"])
    wanted = "warm" if spec.cache == "warm" else "cold"
    observed = "; ".join(f"{n['host']} {n['observed']}" for n in nodes if n["observed"] != wanted) or wanted
    return {"per_node": nodes, "observed": observed}
