"""Issue 8: a rank killed mid-save, a full disk, a hung rank. Real launches, real faults (RH_FAULT injects them
at a chosen point: restart_harness/worker/faults.py), real filesystems."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CASE_LAUNCHER, REPO, case_launcher, copy_run, events, load_summary

pytestmark = pytest.mark.slow


def run_with_fault(args: list[str], results: Path, fault: str | None, timeout: int = 600):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if fault:
        env["RH_FAULT"] = fault
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), *case_launcher(args),
                           f"results_dir={results}"], check=False, capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def only_run(results: Path) -> Path:
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1
    return runs[0]


@pytest.fixture(scope="module")
def killed_mid_save(harness) -> tuple[subprocess.CompletedProcess, Path]:
    """tiny dp=2, rank 1 killed inside its save of global_step4; then restarted (restart-01)."""
    run_dir, proc, _ = harness.played("killed-mid-save")
    return proc, run_dir


def test_killed_rank_fails_the_run_with_its_reason(killed_mid_save):
    proc, run_dir = killed_mid_save
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: checkpoint phase")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "checkpoint phase" in status["reason"]
    assert not (run_dir / "events" / "checkpoint" / "rank-00000.jsonl").read_text().count('"event": "verify"')


def test_latest_names_only_the_last_complete_checkpoint(killed_mid_save):
    _, run_dir = killed_mid_save
    ckpt = run_dir / "checkpoint"
    assert (ckpt / "latest").read_text() == "global_step2"
    # the torn save exists on disk but was never committed
    assert (ckpt / "global_step4").is_dir()
    assert load_summary(run_dir)["checkpoint"]["tag"] == "global_step2"
    assert load_summary(run_dir)["checkpoint"]["files"] == 3


def test_full_disk_fails_cleanly_and_keeps_earlier_checkpoint(tmp_path):
    """A 16 MiB tmpfs holds both planned saves (preflight passes); before step 4 rank 0 fills it, as another job
    would, so the save of global_step4 meets a real ENOSPC from torch.save."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True,
                       capture_output=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {exc}")
    try:
        results = tmp_path / "results"
        proc = run_with_fault(["tiny", "dp=2", "iters=4", "save_interval=2", "after=1", f"ckpt_dir={mount}",
                               "baseline=false"], results, "fill@step:rank=0:step=4")
        assert proc.returncode == 1
        assert "No space left on device" in proc.stderr.strip().splitlines()[-1]
        run_dir = only_run(results)
        ckpt = mount / run_dir.name
        assert (ckpt / "latest").read_text() == "global_step2"
        summary = load_summary(run_dir)
        assert summary["status"]["state"] == "failed" and "No space left" in summary["status"]["reason"]
        assert summary["checkpoint"]["tag"] == "global_step2" and summary["checkpoint"]["files"] == 3
        saved = {f["path"]: f["bytes"] for f in json.loads((run_dir / "inventory.json").read_text())["files"]}
        assert all((ckpt / "global_step2" / p).stat().st_size == b for p, b in saved.items())
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_hung_rank_is_killed_by_the_timeout(tmp_path):
    results = tmp_path / "results"
    proc = run_with_fault(["tiny", "dp=2", "iters=3", "save_interval=3", "timeout=30"], results,
                          "hang@step:rank=1:step=2", timeout=300)
    assert proc.returncode == 1
    assert "timed out" in proc.stderr.strip().splitlines()[-1]
    run_dir = only_run(results)
    steps = [e for e in events(run_dir)[1] if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1]  # it was the hang before step 2 that ran out the clock
    record = json.loads((run_dir / "records" / "checkpoint.json").read_text())
    assert record["timed_out"] is True
    # no rank of this run is left behind
    leftovers = subprocess.run(["pgrep", "-f", str(run_dir)], check=False, capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
    assert load_summary(run_dir)["status"]["state"] == "failed"


def restart_only(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "phase=restart", f"run={run_dir}", *args],
                          check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "RH_FAULT"})


def test_torn_or_missing_checkpoint_refused_before_launch(killed_mid_save, tmp_path):
    run_dir = copy_run(killed_mid_save[1], tmp_path)
    records = sorted(p.name for p in (run_dir / "events").iterdir())
    tag_dir = run_dir / "checkpoint" / "global_step2"
    victim = tag_dir / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    original = victim.read_bytes()
    cases = []
    try:
        victim.write_bytes(original[: len(original) // 2])
        cases.append((restart_only(run_dir), f"{victim}: {len(original) // 2} bytes", "truncated"))
        # the right size, 4 KiB in the middle never written (zeros): only the checksum taken at commit can tell
        middle = len(original) // 2
        victim.write_bytes(original[:middle] + bytes(4096) + original[middle + 4096:])
        cases.append((restart_only(run_dir), f"{victim}: content differs from the sha256", "torn"))
        victim.unlink()
        cases.append((restart_only(run_dir), f"{victim}: missing", "recorded"))
    finally:
        victim.write_bytes(original)
    latest = run_dir / "checkpoint" / "latest"
    try:
        latest.write_text("global_step9")
        cases.append((restart_only(run_dir), "global_step9: missing", "latest"))
    finally:
        latest.write_text("global_step2")
    for proc, named, why in cases:
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and why in lines[0], proc.stderr
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == records  # nothing launched, no record claimed


def test_checksums_taken_at_commit_and_checked_before_the_restart(harness, killed_mid_save):
    """checksums=on: every file of the committed save carries the sha256 of its content, taken by the rank that
    wrote it after the commit (outside the save's figures); the restart-only re-run read them all back first."""
    import hashlib

    _, run_dir = killed_mid_save
    saves = [e for evs in events(run_dir).values() for e in evs if e["event"] == "save"]
    assert {e["tag"] for e in saves} == {"global_step2"}  # the killed save of global_step4 was never committed
    files = [f for e in saves for f in e["files"]]
    assert files and all(e["checksum_seconds"] > 0 for e in saves)
    for f in files:
        assert f["sha256"] == hashlib.sha256((run_dir / "checkpoint" / "global_step2" / f["path"]).read_bytes()
                                             ).hexdigest()
    save = load_summary(run_dir)["checkpoint"]["saves"][0]
    assert save["checksum_seconds"] == max(e["checksum_seconds"] for e in saves)
    _, _, (restart,) = harness.played("killed-mid-save")
    recorded = {f["path"]: f for f in files}
    line = f"[checksums] global_step2: {len(recorded)} files"
    said = restart.stdout + restart.stderr
    assert line in said and "every sha256 as recorded at commit" in said, said
    assert f"before the launch {len(recorded)} files matched their sha256 from the commit" in restart.stdout
    integrity = load_summary(run_dir)["restarts"][0]["integrity"]
    assert integrity["algorithm"] == "sha256" and integrity["files"] == len(recorded)
    assert integrity["bytes"] == sum(f["bytes"] for f in recorded.values())
    from analysis.table import restart_columns  # runs.csv's columns of that restart and the save it loaded

    row = restart_columns(load_summary(run_dir), load_summary(run_dir)["restarts"][0], [])
    assert row["restart_integrity_seconds"] == integrity["seconds"] and row["save_checksum_seconds"] == \
        save["checksum_seconds"]


def test_torn_after_commit_fails_the_runs_restart_before_it_launches(harness):
    """A file of the committed checkpoint torn after the commit (4 KiB zeroed in its middle, its size unchanged: a
    region an asynchronous writer never wrote): the run's own restart is refused, naming the file; nothing loaded
    it."""
    run_dir, proc, _ = harness.played("torn-after-commit")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the committed checkpoint is not whole: ") and "content differs from the sha256" in last
    assert "/checkpoint/global_step2/" in last and "torn" in last, last
    reason = load_summary(run_dir)["status"]["reason"]
    assert "content differs" in reason and (run_dir / "checkpoint" / "latest").read_text() == "global_step2"
    assert not (run_dir / "events" / "restart-01").exists()  # no restart launched, no record claimed


def test_restart_after_kill_loads_last_complete_checkpoint(killed_mid_save):
    _, run_dir = killed_mid_save
    summary = load_summary(run_dir)
    restart = summary["restart"]
    assert restart["record"] == "restart-01" and restart["tag"] == "global_step2" and restart["verified"] is True
    assert summary["restarts"] == [restart]
    # the run keeps the failure of its checkpoint phase: a restart does not make the torn save good
    assert summary["status"]["state"] == "failed" and "checkpoint phase" in summary["status"]["reason"]
    steps = [json.loads(line) for line in (run_dir / "events" / "restart-01" / "rank-00000.jsonl").read_text()
             .splitlines()]
    assert [e["step"] for e in steps if e["event"] == "step"] == [3]  # trained on from step 2, not 4


@pytest.mark.parametrize("launcher", ["local", "mpiexec", "prefork"])
def test_killed_harness_leaves_running_which_readers_see_as_failed(tmp_path, launcher):
    """SIGKILL the harness itself (it cannot write `failed`): its ranks end too (Open MPI's mpiexec puts each rank
    in a process group of its own: the watchdog ends the launch's whole session), status.json keeps `running` with
    its pid and host, readers (a restart, the report) see `failed: harness ended`, and what was learned so far (spec,
    events, the committed save) stays."""
    import signal
    import time

    from restart_harness.rundir.status import observed

    results = tmp_path / "results"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RH_FAULT": "hang@step:rank=0:step=3"}
    harness = subprocess.Popen([sys.executable, str(REPO / "config-n-run.py"), "tiny", "dp=2", "iters=4",
                                "save_interval=2", f"launcher={launcher}", f"results_dir={results}"], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        saved = None
        while time.time() < deadline and saved is None:
            time.sleep(0.5)
            logs = list(results.glob("*/events/checkpoint/rank-00000.jsonl"))
            if logs and '"event": "save"' in logs[0].read_text():
                saved = logs[0]
        assert saved is not None, "the first save never happened"
        harness.kill()
        harness.wait()
    finally:
        if harness.poll() is None:
            harness.kill()
    run_dir = only_run(results)
    # the launcher gets SIGTERM when the harness dies (PR_SET_PDEATHSIG) and ends its ranks: none outlives it
    deadline, left = time.time() + 60, ["?"]
    while time.time() < deadline and left:
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True,
                              check=False).stdout.split()
    for pid in left:  # clean up before failing, never leave ranks behind
        try:
            os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert left == [], "ranks outlived the killed harness"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "running" and status["pid"] == harness.pid and status["host"]
    seen = observed(run_dir)
    assert seen["state"] == "failed" and seen["reason"].startswith("harness ended") and str(harness.pid) in seen["reason"]
    report = subprocess.run([sys.executable, "-m", "analysis", str(run_dir), "-o", str(tmp_path / "report"),
                             "include=failed"], capture_output=True, text=True, cwd=REPO, check=False)
    assert f"skipped {run_dir}: failed: harness ended" in report.stderr, report.stderr
    assert (run_dir / "checkpoint" / "latest").read_text() == "global_step2"
    assert (run_dir / "spec.json").is_file() and not (run_dir / "summary.json").exists()


def test_a_copied_run_restarts_from_its_own_checkpoint_or_not_at_all(harness, tmp_path):
    """A run folder holding its checkpoint, copied: the copy reads its own files (a file missing there is refused,
    even though the original still has it). A run whose checkpoint is outside its folder, copied under another
    name: refused, since the checkpoint it names is another run's."""
    original = harness.run("dp2-short")
    whole = copy_run(original, tmp_path / "whole")
    proc = restart_only(whole)
    assert proc.returncode == 0, proc.stderr
    loaded = next(json.loads(line) for line in (whole / "events" / "restart-02" / "rank-00000.jsonl").read_text()
              .splitlines() if '"event": "loaded"' in line)
    assert loaded["files"] and all(f["path"].startswith(str(whole)) for f in loaded["files"])
    broken = copy_run(original, tmp_path / "broken")
    victim = broken / "checkpoint" / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    victim.unlink()
    proc = restart_only(broken)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"{victim}: missing" in lines[0], proc.stderr

    outside = run_with_fault(["tiny", "iters=2", "save_interval=2", "after=1", "baseline=false", "phase=checkpoint",
                              f"ckpt_dir={tmp_path / 'ckpt'}"], tmp_path / "outside", None)
    assert outside.returncode == 0, outside.stderr
    run_dir = only_run(tmp_path / "outside")
    renamed = tmp_path / "renamed" / f"{run_dir.name}-copy"
    shutil.copytree(run_dir, renamed)
    before = sorted(p.name for p in renamed.iterdir())
    proc = restart_only(renamed)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"placed for run {run_dir.name}" in lines[0], proc.stderr
    assert sorted(p.name for p in renamed.iterdir()) == before


def test_runs_started_together_share_nothing_but_their_folders(tmp_path):
    """Two runs started at the same moment into one results folder and one ckpt_dir: each its own run directory and
    checkpoint folder, both verified; a report over the folder while one still runs reads the other and names the
    running one."""
    import time

    results, ckpt = tmp_path / "results", tmp_path / "ckpt"
    args = [sys.executable, str(REPO / "config-n-run.py"), "tiny", "iters=2", "save_interval=2", "after=1",
            "baseline=false", f"results_dir={results}", f"ckpt_dir={ckpt}", f"launcher={CASE_LAUNCHER}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        outs = [p.communicate(timeout=600) for p in (first, second)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    assert first.returncode == second.returncode == 0, outs
    dirs = [Path(out.strip().splitlines()[-1]) for out, _ in outs]
    assert dirs[0] != dirs[1] and {d.parent for d in dirs} == {results.resolve()}
    for run_dir in dirs:
        summary = load_summary(run_dir)
        assert summary["restart"]["verified"] is True and summary["status"]["state"] == "complete"
        assert summary["checkpoint"]["root"] == str((ckpt / run_dir.name).resolve())
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(d.name for d in dirs)

    # a report while a run is still writing: the finished ones are read, the running one is named as running
    running = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(list(results.iterdir())) < 3:
            time.sleep(0.2)
        report = subprocess.run([sys.executable, "-m", "analysis", str(results), "-o", str(tmp_path / "report")],
                                cwd=REPO, capture_output=True, text=True, check=False)
    finally:
        running.kill()
        running.wait()
    assert report.returncode == 0, report.stderr
    assert "run still in progress" in report.stderr
    with open(tmp_path / "report" / "runs.csv") as f:
        assert sorted(row["run_id"] for row in csv.DictReader(f)) == sorted(d.name for d in dirs)
