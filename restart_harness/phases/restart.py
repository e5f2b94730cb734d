"""The restart phase (a run's own, and restart-only re-runs): each restart fresh ranks with a record of their own,
after the page-cache steps asked for, every rank's restored state verified against what was saved."""

from __future__ import annotations

from pathlib import Path

from restart_harness import envstage
from restart_harness.errors import RunFailed, UsageError
from restart_harness.files import pagecache
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.phases import say
from restart_harness.phases.processes import cache_on_every_node, failure, launch_of
from restart_harness.resolve import Run
from restart_harness.results import events as ev
from restart_harness.rundir import observe
from restart_harness.rundir.create import build_ds_config, deep_merge, port_of
from restart_harness.rundir.scripts import write_launch
from restart_harness.rundir.status import allocate_record, save_record
from restart_harness.schema import count


def restarts(run: Run, repeats: int, relayout=None, facts: dict | None = None, own_spec: bool = False) -> list[str]:
    """`repeats` restarts of run's committed checkpoint, one after another; the records launched. `relayout`: how a
    restart at another layout reads it; `facts`: each record's; `own_spec`: records/spec-<record>.json is run's."""
    launched = []
    facts = {**(facts or {}), "rerun": own_spec}  # a restart-only re-run's outcome is its own, never the run's
    for n in range(repeats):
        record = allocate_record(run.run_dir)
        launched.append(record)
        if own_spec:
            run.write_record_spec(record, run.spec)
        args = []
        if relayout is not None:
            write_json_atomic(run.run_dir / "records" / f"ds_config-{record}.json",
                              deep_merge(build_ds_config(run), relayout.ds_config))
            args = relayout.worker_args()
        write_launch(run, "restart", record, port_of(run), args)
        if own_spec:
            say(f"  restart {n + 1}/{repeats}: record {record}")
        restart(run, record, relayout, facts)
    return launched


def restart(run: Run, record: str, relayout=None, extra: dict | None = None) -> dict:
    """One restart launch of a prepared record, its outcome recorded in records/<record>.json whatever it is
    (verified, failed with the reason, interrupted)."""
    try:
        return _restart(run, record, relayout, extra)
    except (RunFailed, KeyboardInterrupt) as exc:
        # the outcome beside what its launch recorded (nothing, where it never launched)
        outcome = {"state": "failed", "reason": str(exc)} if isinstance(exc, RunFailed) else \
            {"state": "interrupted", "reason": "interrupted (Ctrl-C or SIGTERM) during the restart"}
        path = run.run_dir / "records" / f"{record}.json"
        info = read_json(path) if path.is_file() else {"record": record, "launcher": run.spec.launcher, **(extra or {})}
        save_record(run.run_dir, {**info, "outcome": outcome})
        raise


def _restart(run: Run, record: str, relayout=None, extra: dict | None = None) -> dict:
    """With env_stage=, the environment's copy is made first (the cache steps then act on it, the launch script runs
    from it) and removed when the restart ends."""
    target, spec = run.target, run.spec
    tag = run.stored.latest()
    if tag is None:
        raise RunFailed(f"no committed checkpoint in {target.describe()} (no 'latest'): nothing to restart from")
    load_dir = relayout.load_dir if relayout and relayout.load_dir else target.root / tag
    staged = None
    if spec.env_stage is not None:
        say(f"  [{record}] staging the environment into {spec.env_stage}")
        staged = envstage.stage(spec.env_stage, f"{run.run_dir.name}-{record}")
    try:
        if staged is not None:
            write_launch(run, "restart", record, port_of(run), relayout.worker_args() if relayout else None,
                         staged=staged)
            st = staged.record
            say(f"  [{record}] staged {st['files']:,} files, {st['bytes'] / 2**30:.2f} GiB in {st['seconds']:.1f} s "
                f"({st['filesystem']['type']} on {st['filesystem']['mount']})")
        return _launch(run, record, load_dir, staged, extra)
    finally:
        envstage.remove(staged)


def _launch(run: Run, record: str, load_dir: Path, staged, extra: dict | None) -> dict:
    """The cache steps (the checkpoint's, the environment's), the launch, its record and its verification."""
    spec = run.spec
    # env_cache=warm or keep: the checkpoint's pages evicted file by file; cache=warm: the environment's likewise
    per_file = spec.env_cache in ("warm", "keep")
    state = run.stored.prepare_cache(load_dir, spec.cache, per_file=per_file)
    if spec.across_nodes and state.get("method") is not None:  # a node's page cache is its own: every node's
        state = {**state, **cache_on_every_node(run, load_dir, per_file)}
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
    say(f"  [{record}] launching {count(spec.launched_ranks, 'fresh rank')}")
    info = launch_of(run, record, cleanup=[staged.folder] if staged else None)
    info.update(cache=state, environment_cache=env_state, launcher=spec.launcher, **(extra or {}))
    if staged is not None:
        info["staging"] = staged.record
    save_record(run.run_dir, info)
    if info["exit_code"] != 0:
        raise RunFailed(failure(run, info))
    failed, tensors = ev.verification(ev.read_record(run.run_dir, record), spec.launched_ranks)
    if failed:
        raise RunFailed(f"{record}: restart did not restore the saved state: {', '.join(failed[:5])}")
    info["outcome"] = {"state": "verified", "reason": None}
    save_record(run.run_dir, info)
    say(f"  [{record}] restored state verified on every rank ({count(spec.launched_ranks, 'rank')}, "
        f"{count(tensors, 'tensor')})")
    return info


def whole_checkpoint(run: Run) -> dict | None:
    """Before the restart of phase=all: the committed checkpoint's files are the ones its save recorded (bytes, and
    content where it recorded checksums), as a restart-only re-run checks before it launches."""
    from restart_harness import preflight

    try:
        tag, integrity = preflight.committed_checkpoint(run)
    except UsageError as exc:
        raise RunFailed(f"the committed checkpoint is not whole: {exc}") from None
    if integrity:
        say(f"  {integrity_line(tag, integrity)}")
    return integrity


def integrity_line(tag: str, integrity: dict) -> str:
    return (f"[checksums] {tag}: {integrity['files']} files, {integrity['bytes'] / 2**20:.2f} MiB read back, every "
            f"{integrity['algorithm']} as recorded at commit ({integrity['seconds']:.2f} s)")


def abort_incomplete_uploads(run: Run, record: str) -> dict | None:
    """After a checkpoint phase, and before a restart-only re-run: uploads a failed save left unfinished, aborted (or
    why they could not be), said in one line when there were any."""
    target = run.target
    found = run.stored.abort_incomplete_uploads()
    if found and found["aborted"]:
        say(f"  [{record}] aborted {len(found['aborted'])} incomplete multipart uploads under {target.describe()} "
            f"left by a failed save ({', '.join(found['aborted'][:3])}{', ...' if len(found['aborted']) > 3 else ''})")
    if found and found["error"]:
        say(f"  [{record}] could not list or abort incomplete multipart uploads under {target.describe()}: "
            f"{found['error']}; a restart-only re-run (restart run=) tries again")
    return found
