"""Ctrl-C and SIGTERM at each phase: the harness ends within a bounded time, takes every rank with it, and records
the interruption where it belongs - the run's own phase marks the run failed ("interrupted"); a restart-only re-run
is that re-run's outcome, and the run, with what it verified, stays as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, case_launcher, copy_run, load_summary

pytestmark = pytest.mark.slow

# a harness told to stop ends its launch's session and waits for it within this (phases/processes.py)
ENDS_WITHIN_SECONDS = 90


def interrupted(cmd: list[str], when: str, how: int = signal.SIGTERM, env: dict | None = None) -> tuple[int, str]:
    """Run cmd, send `how` once its stderr says `when`; its exit code and stderr."""
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    said = []
    for line in proc.stderr:
        said.append(line)
        if when in line:
            proc.send_signal(how)
            break
    else:
        raise AssertionError("".join(said))
    try:
        rest = proc.communicate(timeout=ENDS_WITHIN_SECONDS)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running {ENDS_WITHIN_SECONDS} s after the signal: {''.join(said)}") from None
    return proc.returncode, "".join(said) + rest


def ranks_left(run_dir: Path) -> list[str]:
    time.sleep(1)  # the watchdog's last kills
    out = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_a_checkpoint_phase_interrupted_ends_its_ranks_and_the_run(tmp_path):
    results = tmp_path / "results"
    cmd = [sys.executable, str(REPO / "config-n-run.py"),
           *case_launcher(["tiny", "dp=2", "iters=400", "save_interval=200", f"results_dir={results}"])]
    code, said = interrupted(cmd, "[checkpoint] step 2/", signal.SIGINT)
    assert code == 130 and "interrupted" in said.splitlines()[-1], said
    (run_dir,) = results.iterdir()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["reason"] == "interrupted", status
    assert ranks_left(run_dir) == []


def test_ranks_interrupted_while_they_build_an_op_leave_no_lock_behind(tmp_path):
    """A rank killed mid-build leaves torch's build lock, on which every later run would wait (third_party/
    torch_extension_lock.py): the harness removes it once the launch is gone. A fresh cache: the first CPU run builds
    DeepSpeed's shm_comm op."""
    cache = tmp_path / "cache"
    cmd = [sys.executable, str(REPO / "config-n-run.py"),
           *case_launcher(["tiny", "dp=2", "iters=2", f"results_dir={tmp_path / 'results'}"])]
    code, said = interrupted(cmd, "op is being built", signal.SIGINT, env={**os.environ, "RH_CACHE_DIR": str(cache)})
    assert code == 130, said
    assert "left unfinished" in said, said
    assert not list(cache.glob("torch_extensions/*/*/lock")), said


def test_an_interrupted_re_run_is_its_own_outcome_and_the_run_stays_complete(harness, tmp_path):
    run_dir = copy_run(harness.run("tiny-dp2"), tmp_path)
    restart = [sys.executable, str(REPO / "config-n-run.py"), "restart", f"run={run_dir}"]
    code, said = interrupted(restart, "launching 2 fresh ranks")
    assert code == 130, said
    assert ranks_left(run_dir) == []
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete", summary["status"]
    last = summary["restarts"][-1]
    assert last["record"] == "restart-02" and last["rerun"] and last["outcome"]["state"] == "interrupted", last
    assert last["total_seconds"] is None  # it never reached its first step, where that figure ends
    assert summary["restarts"][0]["outcome"]["state"] == "verified"
    # the next re-run claims its own record and verifies; the interrupted one stays recorded as it ended
    again = subprocess.run(restart, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr
    outcomes = {r["record"]: r["outcome"]["state"] for r in load_summary(run_dir)["restarts"]}
    assert outcomes == {"restart-01": "verified", "restart-02": "interrupted", "restart-03": "verified"}, outcomes
