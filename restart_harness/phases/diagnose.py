"""Why a launch failed, in one line: a time limit, a rank the kernel's OOM killer ended (its peers' lost connections
follow from it), ranks the launcher says were killed (a lost node), or the first error a rank recorded, else the exit
code and the log to read."""

from __future__ import annotations

from restart_harness import resolve
from restart_harness.results import events as ev
from restart_harness.results import placement

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
    if killed := out_of_memory(record, info.get("oom"), verdicts):
        lost = placement.lost(record, run.spec.launched_ranks, verdicts)
        after = "; ".join(x for x in (errors[:1] + [lost or ""]) if x)
        return (f"{info['record']} phase failed: {killed}" + (f"; what the others did after it: {after}" if after
                                                                else "") + f" (exit code {info['exit_code']}; see {log})")
    lost = placement.lost(record, run.spec.launched_ranks, verdicts)
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
