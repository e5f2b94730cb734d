"""Phases on real launches: phase=checkpoint (with torchrun), then restart-only re-runs of that run, each its
own record, as summary.json's `restarts`; keep=false deletes the checkpoint, after which a restart is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_summary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint_only(harness) -> Path:
    """tiny dp=2 launcher=torchrun phase=checkpoint; then `restart repeats=2 cache=warm keep=false`; then one more
    restart, refused."""
    return harness.run("checkpoint-only-torchrun")


def test_checkpoint_phase_alone(harness, checkpoint_only):
    """What the checkpoint phase alone printed: its summary, with a checkpoint and no restart."""
    _, first, _ = harness.played("checkpoint-only-torchrun")
    rows = {line.split("  ")[0]: line for line in first.stdout.splitlines()}
    assert rows["status"].split()[-1] == "complete" and "restart" not in rows and "verified" not in rows
    assert "global_step2: 3 files" in rows["checkpoint"]
    assert "torch.distributed.run" in (checkpoint_only / "launch-checkpoint.sh").read_text()


def test_restart_only_reruns_append_records_then_keep_false(harness, checkpoint_only):
    _, _, (proc, again) = harness.played("checkpoint-only-torchrun")
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
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "checkpoint directory" in again.stderr and "missing" in again.stderr
    assert not (checkpoint_only / "events" / "restart-03").exists()
