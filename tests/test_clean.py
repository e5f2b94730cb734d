"""`./submit-job.sh clean`: the checkpoints of finished runs deleted, their results kept; a dry run by default."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, copy_run, load_summary, restart


def clean(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "clean", *args], capture_output=True,
                          text=True, check=False, timeout=120, cwd=REPO)


@pytest.mark.slow
def test_clean_lists_then_deletes_checkpoints_and_keeps_results(harness, tmp_path):
    runs = tmp_path / "results"
    small = copy_run(harness.run("dp2-short"), runs)  # one checkpoint (global_step2)
    large = copy_run(harness.run("tiny-dp2"), runs)  # two (global_step2, global_step4)
    summary = load_summary(small)
    size = sum(p.stat().st_size for p in (small / "checkpoint").rglob("*") if p.is_file())

    listed = clean(f"folder={runs}", "prefix=tiny-")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("would delete ") == 3 and "apply=true deletes them" in listed.stdout  # 2 runs, total
    assert (small / "checkpoint").is_dir() and (large / "checkpoint").is_dir()  # a dry run deletes nothing

    bigger = clean(f"folder={runs}", f"larger_than={size}", "older_than_hours=0", "apply=true")
    assert bigger.returncode == 0, bigger.stderr
    assert not (large / "checkpoint").exists() and (small / "checkpoint").is_dir()
    assert f"deleted {large / 'checkpoint'}: " in bigger.stdout

    rest = clean(f"folder={runs}", "apply=true")
    assert not (small / "checkpoint").exists()
    assert rest.stdout.splitlines()[-2].startswith("deleted the checkpoints of 1 finished run,"), rest.stdout
    assert rest.stdout.splitlines()[-1] == "left alone: 1 run already cleaned", rest.stdout
    assert load_summary(small) == summary and (small / "events" / "checkpoint").is_dir()  # results kept
    assert json.loads((small / "status.json").read_text())["checkpoint_deleted"] is True
    again = restart(small)
    assert again.returncode == 2 and "nothing to restart from" in again.stderr and len(again.stderr.splitlines()) == 1
    last = clean(f"folder={runs}").stdout.splitlines()
    assert last[-2].startswith("would delete the checkpoints of 0 finished runs") and last[-1].endswith("2 runs already cleaned")


@pytest.mark.parametrize("args, named", [
    (["folder=/nonexistent/runs"], "folder=/nonexistent/runs: no such directory"),
    (["older_than_hours=-1"], "older_than_hours=-1"),
    (["apply=maybe"], "apply=maybe"),
    (["run=x"], "not a clean key"),
])
def test_clean_refuses_bad_input_in_one_line(args, named):
    proc = clean(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
