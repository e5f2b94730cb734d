"""Phases on real launches: phase=checkpoint (with torchrun), then restart-only re-runs of that run, each its
own record, as summary.json's `restarts`; keep=false deletes the checkpoint, after which a restart is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, load_summary, run_cli, run_dir_of

pytestmark = pytest.mark.slow


def restart_cli(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "phase=restart", f"run={run_dir}", *args],
                          check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def checkpoint_only(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("phases")
    proc = run_cli(["tiny", "dp=2", "launcher=torchrun", "phase=checkpoint", "iters=2", "save_interval=2",
                    "after=1"], results)
    return run_dir_of(proc)


def test_checkpoint_phase_alone(checkpoint_only):
    summary = load_summary(checkpoint_only)
    assert summary["status"]["state"] == "complete" and summary["restart"] is None and summary["restarts"] == []
    assert (checkpoint_only / "checkpoint" / "latest").read_text() == "global_step2"
    assert not (checkpoint_only / "events" / "restart-01").exists()
    assert "torch.distributed.run" in (checkpoint_only / "launch-checkpoint.sh").read_text()


def test_restart_only_reruns_append_records_then_keep_false(checkpoint_only):
    proc = restart_cli(checkpoint_only, "repeats=2", "cache=warm", "keep=false")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip().splitlines()[-1]) == checkpoint_only
    summary = load_summary(checkpoint_only)
    assert [r["record"] for r in summary["restarts"]] == ["restart-01", "restart-02"]
    assert summary["restart"] == summary["restarts"][-1]
    for r in summary["restarts"]:
        assert r["verified"] is True and r["tag"] == "global_step2" and r["cache"]["requested"] == "warm"
    assert [json.loads((checkpoint_only / "records" / f"restart-0{n}.json").read_text())["launcher"]
            for n in (1, 2)] == ["torchrun", "torchrun"]
    # restarts trained the same steps from the same state
    steps = [[e["loss"] for e in map(json.loads, (checkpoint_only / "events" / r / "rank-00000.jsonl")
                                     .read_text().splitlines()) if e["event"] == "step"]
             for r in ("restart-01", "restart-02")]
    assert steps[0] == steps[1] and len(steps[0]) == 1
    # keep=false: the checkpoint is gone, the results stay, and a further restart is refused up front
    status = json.loads((checkpoint_only / "status.json").read_text())
    assert status["checkpoint_deleted"] is True and not (checkpoint_only / "checkpoint").exists()
    again = restart_cli(checkpoint_only)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "checkpoint directory" in again.stderr and "missing" in again.stderr
    assert not (checkpoint_only / "events" / "restart-03").exists()
