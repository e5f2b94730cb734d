"""Issue 66 item 6: a rank the kernel's OOM killer ends is named as the cause of the failure, with its memory then and
the limit it met; its peers' lost connections come after it. A real launch in a real memory cgroup (root, a
writable /sys/fs/cgroup), and the same path over a stand-in cgroup that records a kill the way the kernel does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, case_launcher

from restart_harness.files import kernel_memory
from restart_harness.phases import processes as diagnose

LIMIT_BYTES = 2560 << 20  # a tiny dp=2 run (the harness, the launcher, two ranks) takes ~1.2 GiB of it
LEAK_MIB = 3072  # what rank 1 holds at its first save: more than the limit, so the kernel kills it


def memory_cgroup(name: str, limit: int) -> Path | None:
    """A new memory cgroup limited to `limit` bytes, without swap (cgroup v2 where its memory controller is given
    to children, else v1's memory hierarchy), or None where this machine does not let us make one."""
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
    try:
        if "memory" in (v2 / "cgroup.subtree_control").read_text().split() if (v2 / "cgroup.controllers").is_file() \
                else False:
            group = v2 / name
            group.mkdir()
            (group / "memory.max").write_text(str(limit))
            if (group / "memory.swap.max").is_file():
                (group / "memory.swap.max").write_text("0")
            return group
        if (v1 / "memory.limit_in_bytes").is_file():
            group = v1 / name
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(limit))
            return group
    except OSError:
        return None
    return None


def remove(group: Path) -> None:
    for _ in range(50):  # its last processes (the launch's watchdog) may take a moment to go
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.2)


@pytest.mark.slow
def test_a_rank_killed_for_memory_is_the_reason_not_its_peers_errors(tiny_dp2, tmp_path):
    """tiny_dp2 first: DeepSpeed's op is built outside the limit (the compiler alone would meet it)."""
    group = memory_cgroup(f"rh-test-oom-{os.getpid()}", LIMIT_BYTES)
    if group is None:
        pytest.skip("no memory cgroup can be made here (not root, or /sys/fs/cgroup read-only); the stand-in test "
                    "below covers the same path")
    procs = str(group / "cgroup.procs")
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "config-n-run.py"),
             *case_launcher(["tiny", "dp=2", "iters=2", "save_interval=2", "after=1", "baseline=false"]),
             f"results_dir={tmp_path}"],
            check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "RH_FAULT": f"leak@save:rank=1:mib={LEAK_MIB}"},
            preexec_fn=lambda: Path(procs).write_text(str(os.getpid())))  # the harness and all it starts
    finally:
        remove(group)
    assert proc.returncode == 1, proc.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    reason = json.loads((run_dir / "status.json").read_text())["reason"]
    pid = next(json.loads(line)["pid"] for line in (run_dir / "events" / "checkpoint" / "rank-00001.jsonl")
               .read_text().splitlines() if '"process"' in line)
    limit_gib = f"{LIMIT_BYTES / 2**30:,.2f} GiB limit"
    # first the kill, its rank, its memory and the limit; the peer's connection error only after it
    head = reason.split("; what the others did after it")[0]
    assert head.startswith(f"checkpoint phase failed: rank 1 (pid {pid}) killed by the kernel's OOM killer (SIGKILL): "
                           ), reason
    assert "GiB resident" in head and limit_gib in head and group.name in head, reason
    assert "gloo" not in head and "without a word" not in head, reason
    assert proc.stderr.strip().splitlines()[-1] == f"error: {reason}"
    record = json.loads((run_dir / "records" / "checkpoint.json").read_text())
    kill = next(k for k in record["oom"]["kills"] if k["pid"] == pid)
    assert kill["cgroup_limit_bytes"] == LIMIT_BYTES and kill["rss_bytes"] > LIMIT_BYTES // 2


def test_a_stand_in_cgroup_that_records_an_oom_kill_names_the_rank(tmp_path, monkeypatch):
    """The same watch over a stand-in of cgroup v2: memory.events' oom_kill rises while the launch runs, the kernel
    log cannot be read. The reason says the kernel's OOM killer, the count and the memory, before the peers' error."""
    group = tmp_path / "sys" / "rh"
    group.mkdir(parents=True)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/rh\n")
    for name, value in {"memory.max": LIMIT_BYTES, "memory.current": LIMIT_BYTES - 4096,
                        "memory.peak": LIMIT_BYTES}.items():
        (group / name).write_text(f"{value}\n")
    events = group / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n")
    monkeypatch.setattr(kernel_memory, "CGROUP_ROOT", tmp_path / "sys")
    monkeypatch.setattr(kernel_memory, "PROC_CGROUP", proc)
    monkeypatch.setattr(kernel_memory, "KMSG", str(tmp_path / "no-kmsg"))
    watch = kernel_memory.OomWatch()
    assert watch.result() is None  # nothing killed: nothing said
    watch = kernel_memory.OomWatch()
    events.write_text("low 0\nhigh 0\nmax 40\noom 2\noom_kill 1\n")  # the kernel killed one process of the group
    oom = watch.result()
    assert oom["kills"] is None and oom["cgroup"]["oom_kills_before"] == 0 and oom["cgroup"]["oom_kills"] == 1
    record = {0: [{"event": "process", "pid": 11}, {"event": "error", "message": "RuntimeError: [gloo] Connection "
                                                                                 "closed by peer"}],
              1: [{"event": "process", "pid": 12}]}
    said = diagnose.out_of_memory(record, oom, {})
    assert said.startswith("the kernel's OOM killer ended 1 process(es) of this cgroup") and "oom_kill 0 -> 1" in said
    assert f"peak {LIMIT_BYTES / 2**30:,.2f} GiB of its {LIMIT_BYTES / 2**30:,.2f} GiB limit" in said
    # where the kernel log names the rank's pid: that rank, its memory and its cgroup's limit
    kill = {"pid": 12, "process": "python", "rss_bytes": 3 << 30, "cgroup": "/rh", "cgroup_usage_bytes": LIMIT_BYTES,
            "cgroup_limit_bytes": LIMIT_BYTES}
    verdicts: dict[int, str] = {}
    said = diagnose.out_of_memory(record, {**oom, "kills": [kill, {**kill, "pid": 99}]}, verdicts)
    assert said == ("rank 1 (pid 12) killed by the kernel's OOM killer (SIGKILL): 3.00 GiB resident, its cgroup /rh "
                    "at 2.50 GiB of its 2.50 GiB limit")
    assert verdicts == {1: diagnose.OOM_KILLED}
