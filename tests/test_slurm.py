"""launcher=slurm against a real single-node Slurm that this module starts and stops (tests/slurm_cluster.py):
sbatch submits the generated job, ranks start through srun, the restart is a second srun step in fresh
processes, and finalize runs inside the job into the same run directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, load_summary, require_tool
from slurm_cluster import BINARIES, slurm_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_tool(*BINARIES, package="slurm-wlm and munge")
    root = tmp_path_factory.mktemp("slurm")
    with slurm_cluster(root / "cluster") as env:
        yield env, root / "results"


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), *args], check=False, capture_output=True,
                          text=True, env=env, timeout=120, cwd=REPO)


def wait_for_job(env: dict, job_id: str, seconds: int = 400) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=env,
                               check=False).stdout
        if job_id not in queue:
            return
        time.sleep(2)
    raise AssertionError(f"slurm job {job_id} still queued or running after {seconds} s")


@pytest.fixture(scope="module")
def slurm_run(cluster):
    env, results = cluster
    proc = cli(env, "tiny", "dp=2", "launcher=slurm", "walltime=00:10:00", "iters=2", "save_interval=2", "after=1",
               f"results_dir={results}")
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    wait_for_job(env, json.loads((run_dir / "job.json").read_text())["job_id"])
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env, check=False).stdout
    return proc, run_dir, queue


def test_job_submitted_and_id_printed(slurm_run):
    proc, run_dir, queue = slurm_run
    job = json.loads((run_dir / "job.json").read_text())
    assert job["scheduler"] == "slurm" and job["job_id"].isdigit()
    assert f"job {job['job_id']}" in proc.stdout.splitlines()
    assert queue.strip() == ""  # the job ended
    assert (run_dir / "job.sbatch").is_file() and (run_dir / "logs" / f"job-{job['job_id']}.log").is_file()


def test_run_completes_inside_the_job_and_verifies(slurm_run):
    _, run_dir, _ = slurm_run
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete", summary["status"]
    restart = summary["restart"]
    assert restart["verified"] is True and restart["ranks"] == 2 and restart["tag"] == "global_step2"
    assert "srun" in (run_dir / "launch-checkpoint.sh").read_text()


def test_restart_is_a_separate_srun_step_in_fresh_processes(slurm_run):
    _, run_dir, _ = slurm_run
    checkpoint = json.loads((run_dir / "records" / "checkpoint.json").read_text())
    ended = checkpoint["start"] + checkpoint["wall_seconds"]
    for path in (run_dir / "events" / "restart-01").glob("rank-*.jsonl"):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        start = next(e["t"] for e in events if e["event"] == "mark" and e["name"] == "process_start")
        assert start > ended  # started after every checkpoint rank had exited
    ranks = sorted(p.name for p in (run_dir / "events" / "checkpoint").iterdir())
    assert ranks == ["rank-00000.jsonl", "rank-00001.jsonl"]


def test_restart_only_rerun_is_a_job_of_its_own(cluster, slurm_run):
    env, _ = cluster
    _, run_dir, _ = slurm_run
    proc = cli(env, "phase=restart", f"run={run_dir}", "cache=warm")
    assert proc.returncode == 0, proc.stderr
    job = json.loads((run_dir / "job-restart-1.json").read_text())
    assert f"job {job['job_id']}" in proc.stdout.splitlines() and job["args"] == ["cache=warm"]
    assert (run_dir / "job-restart-1.sbatch").read_text().rstrip().endswith(f"{run_dir} phase=restart cache=warm")
    wait_for_job(env, job["job_id"])
    summary = load_summary(run_dir)
    assert [r["record"] for r in summary["restarts"]] == ["restart-01", "restart-02"]
    assert summary["restart"]["verified"] is True and summary["restart"]["cache"]["requested"] == "warm"
    assert json.loads((run_dir / "records" / "restart-02.json").read_text())["launcher"] == "slurm"


@pytest.mark.parametrize("args, named", [
    (["queue=nosuchpartition"], "sbatch --test-only refuses the job"),
    (["dp=4", "ranks_per_node=4", "nodes=1"], "sbatch --test-only refuses the job"),  # 4 tasks on a 2-CPU node
])
def test_a_job_slurm_would_refuse_is_one_line_before_anything_exists(cluster, tmp_path, args, named):
    env, _ = cluster
    results = tmp_path / "results"
    proc = cli(env, "tiny", "launcher=slurm", *args, f"results_dir={results}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
    assert not results.exists()
