"""A real sweep: one combination fails (a rank is killed inside its step-4 save), the sweep records why and goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CASE_LAUNCHER, REPO, load_summary

pytestmark = pytest.mark.slow


def test_failing_combination_is_recorded_and_the_sweep_goes_on(tmp_path):
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "tiny", "dp=2", "iters=4,2", "save_interval=2",
                           f"results_dir={results}", f"launcher={CASE_LAUNCHER}"], check=False,
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "RH_FAULT": "kill@save:rank=1:step=4"})
    assert proc.returncode == 1, proc.stderr  # not every combination completed
    sweep_dir = Path(proc.stdout.strip().splitlines()[-1])
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert sweep["lists"] == {"iters": ["4", "2"]} and sweep["state"] == "complete"
    failed, done = sweep["runs"]
    assert failed["combination"] == {"iters": "4"} and failed["state"] == "failed"
    assert "checkpoint phase failed" in failed["reason"] and "global_step2" in failed["reason"], failed["reason"]
    assert done["combination"] == {"iters": "2"} and done["state"] == "complete" and done["reason"] is None
    assert load_summary(Path(done["run_dir"]))["training"]["steps"] == 2
    assert load_summary(Path(failed["run_dir"]))["status"]["state"] == "failed"
    assert sweep["counts"] == {"complete": 1, "failed": 1}
    assert "[sweep 1/2" in proc.stderr and "[sweep 2/2" in proc.stderr
    # before it starts: the time and bytes it will take; as it goes: elapsed, and what is left from the runs done
    first = next(line for line in proc.stderr.splitlines() if line.startswith("[sweep]"))
    assert first.startswith("[sweep] 2 runs: about ") and "of checkpoints kept" in first, first
    assert sweep["estimate"]["runs_predicted"] == 2 and sweep["estimate"]["checkpoint_bytes"] > 0
    done_line = next(line for line in proc.stderr.splitlines() if line.startswith("[sweep 1/2") and "failed" in line)
    assert "; elapsed " in done_line and " left" in done_line, done_line
