"""Run one RunSpec: create the run directory, write the generated artifacts, launch the checkpoint phase,
make the page-cache state asked for, launch the restart phase in fresh processes, and finalize."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from engines import registry
from restart_harness.errors import RunFailed
from restart_harness.generate.ds_config import build_ds_config
from restart_harness.generate.launch import launch_script, local_command, worker_args
from restart_harness.launch import baseline, cache, host
from restart_harness.results import finalize
from restart_harness.results.atomic import write_json_atomic, write_text_atomic
from restart_harness.spec.runspec import RunSpec


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def new_run_dir(spec: RunSpec) -> Path:
    """results/<model>-<layout>-<engine>-<time>, created exclusively: a run never reuses another's folder."""
    root = Path(spec.results_dir)
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"{spec.model_label}-{spec.layout}-{spec.engine}-{stamp}".replace("/", "_")
    for n in range(1, 1000):
        path = root / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
            return path.resolve()
        except FileExistsError:
            continue
    raise RunFailed(f"could not create a fresh run directory under {root}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_status(run_dir: Path, state: str, reason: str | None = None) -> None:
    write_json_atomic(run_dir / "status.json", {"state": state, "reason": reason, "time": time.time()})


def prepare(spec: RunSpec) -> tuple[Path, Path]:
    """Run directory with spec.json, ds_config.json and the launch scripts; returns (run_dir, ckpt_root)."""
    run_dir = new_run_dir(spec)
    set_status(run_dir, "running")
    ckpt_root = Path(spec.ckpt_dir).resolve() / run_dir.name if spec.ckpt_dir else run_dir / "checkpoint"
    write_json_atomic(run_dir / "spec.json", {**spec.to_json(), **host.facts(ckpt_root.parent if spec.ckpt_dir else run_dir),
                                             "checkpoint_root": str(ckpt_root)})
    write_json_atomic(run_dir / "ds_config.json", build_ds_config(spec))
    port = spec.master_port or free_port()
    for phase, record in (("checkpoint", "checkpoint"), ("restart", "restart-01")):
        command = local_command(spec, port, worker_args(run_dir, phase, record, ckpt_root))
        write_text_atomic(run_dir / f"launch-{record}.sh", launch_script(spec, phase, command), mode=0o755)
    return run_dir, ckpt_root


def _progress_line(record: str, e: dict) -> str | None:
    kind = e["event"]
    if kind == "step":
        return f"  [{record}] step {e['step']}/{e['last']}  loss {e['loss']:.4f}  {e['seconds']:.2f} s"
    if kind == "save":
        return (f"  [{record}] saved {e['tag']}: rank 0 wrote {len(e['files'])} files, {e['bytes'] / 2**20:.2f} MiB; "
                f"blocking {e['blocking_seconds']:.3f} s, durable {e['durable_seconds']:.3f} s")
    if kind == "mark" and e["name"] in ("engine_initialized", "checkpoint_loaded"):
        return f"  [{record}] {e['name'].replace('_', ' ')}"
    if kind == "verify":
        state = "verified" if e["ok"] else f"MISMATCH in {e['differing_count']} tensors"
        return f"  [{record}] restored state {state} (rank 0, {e['tensors']} tensors)"
    if kind == "error":
        return f"  [{record}] rank 0 error: {e['message']}"
    return None


def launch(run_dir: Path, record: str, timeout: int) -> dict:
    """Run launch-<record>.sh, logging its output and showing rank 0's progress; kill it on timeout."""
    log_path = run_dir / "logs" / f"{record}.log"
    log_path.parent.mkdir(exist_ok=True)
    events = run_dir / "events" / record / "rank-00000.jsonl"
    start = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", str(run_dir / f"launch-{record}.sh")], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        offset, timed_out = 0, False
        while True:
            try:
                proc.wait(timeout=0.5)
                done = True
            except subprocess.TimeoutExpired:
                done = False
            if events.is_file():
                with open(events) as f:
                    f.seek(offset)
                    chunk = f.read()
                complete = chunk[: chunk.rfind("\n") + 1]
                offset += len(complete.encode())
                for line in complete.splitlines():
                    msg = _progress_line(record, json.loads(line))
                    if msg:
                        say(msg)
            if done:
                break
            if time.time() - start > timeout:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
    result = {"record": record, "start": start, "wall_seconds": round(time.time() - start, 3),
              "exit_code": proc.returncode, "timed_out": timed_out, "log": str(log_path.relative_to(run_dir))}
    (run_dir / "records").mkdir(exist_ok=True)
    return result


def _save_record(run_dir: Path, info: dict) -> None:
    write_json_atomic(run_dir / "records" / f"{info['record']}.json", info)


def _failure(run_dir: Path, info: dict) -> str:
    from restart_harness.results import events as ev

    errors = ev.errors(ev.read_record(run_dir, info["record"]))
    if info["timed_out"]:
        return f"{info['record']} phase timed out after {info['wall_seconds']:.0f} s (timeout=); process group killed"
    if errors:
        return f"{info['record']} phase failed: {errors[0]}"
    return f"{info['record']} phase exited with code {info['exit_code']}; see {run_dir / info['log']}"


def run(spec: RunSpec) -> Path:
    """checkpoint phase -> cache state -> restart phase -> summary. Returns the run directory."""
    run_dir, ckpt_root = prepare(spec)
    say(f"run {run_dir.name}: {spec.model_label}, {spec.layout} ({spec.world_size} ranks, {spec.device}), "
        f"engine {spec.engine}, {spec.precision}")
    try:
        probe = baseline.record_for_run(run_dir, spec, ckpt_root)
        if probe:
            say(f"  [baseline] {probe.get('error') or _baseline_line(probe)}")
        say(f"  [checkpoint] launching {spec.world_size} ranks (log: {run_dir / 'logs' / 'checkpoint.log'})")
        info = launch(run_dir, "checkpoint", spec.timeout)
        _save_record(run_dir, info)
        if info["exit_code"] != 0:
            raise RunFailed(_failure(run_dir, info))
        if getattr(registry.get_spec(spec.engine).plugin(), "SAVES", True):
            restart(run_dir, ckpt_root, spec, "restart-01")
        summary = finalize.finalize(run_dir, state="complete")
    except RunFailed as exc:
        finalize.finalize(run_dir, state="failed", reason=str(exc))
        raise
    except KeyboardInterrupt:
        finalize.finalize(run_dir, state="failed", reason="interrupted")
        raise
    if summary["restart"] and not summary["restart"]["verified"]:
        raise RunFailed(f"restart did not restore the saved state: {', '.join(summary['restart']['differing'][:5])}")
    return run_dir


def _baseline_line(b: dict) -> str:
    return (f"storage {'(cached) ' if b['cached'] else ''}write {b['write_mib_s']} MiB/s, read {b['read_mib_s']} MiB/s "
            f"({b['method']}, {b['ranks']} x {b['file_bytes']} bytes)")


def restart(run_dir: Path, ckpt_root: Path, spec: RunSpec, record: str) -> dict:
    latest = ckpt_root / "latest"
    if not latest.is_file():
        raise RunFailed(f"no committed checkpoint under {ckpt_root} (no 'latest'): nothing to restart from")
    tag_dir = ckpt_root / latest.read_text().strip()
    files = [p for p in tag_dir.rglob("*") if p.is_file()]
    state = cache.prepare(files, spec.cache)
    say(f"  [{record}] page cache: asked {state['requested']}, observed {state['observed']}"
        + (f" ({state['error']})" if state["error"] else ""))
    say(f"  [{record}] launching {spec.world_size} fresh ranks")
    info = launch(run_dir, record, spec.timeout)
    info["cache"] = state
    _save_record(run_dir, info)
    if info["exit_code"] != 0:
        raise RunFailed(_failure(run_dir, info))
    return info
