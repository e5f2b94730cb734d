"""From a login node to GPU nodes, as far as a machine without a GPU goes: a local Slurm cluster of 2 nodes with 4
stand-in GPUs each (generic resources backed by empty device files: `local-cluster.sh up 2 gpus=4`). The job
scripts the harness writes for device=cuda are scheduled and bound by a real slurmctld; what each rank would be
given is read from the generated launch script run with a probe in place of the worker; a device=cuda run then
ends in the job, before any rank starts, with one line naming the node that cannot run it (no NVIDIA driver, no
DataStates-LLM)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, one_worker
from slurm_cluster import cli, slurm_cluster, wait_for_job

pytestmark = pytest.mark.slow
GPUS = 4


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    one_worker("gpu_slurm_cluster", tmp_path_factory)
    root = tmp_path_factory.mktemp("gpu-slurm")
    with slurm_cluster(root / "cluster", 2, gpus=GPUS) as c:
        yield c, root / "results"


def test_stand_in_gpus_are_scheduled_and_bound_as_on_a_gpu_cluster(gpu_cluster, tmp_path):
    """The harness's own job script (--gpus-per-node) and launch script (srun), with a probe in place of the worker:
    each rank sees its node's GPUs of the job, SLURM_GPUS_ON_NODE, and takes the CUDA device of its local rank."""
    c, results = gpu_cluster
    proc = cli(c, "tiny", "tp=2", "dp=2", "nodes=2", "ranks_per_node=2", "launcher=slurm", "device=cuda",
               "dry_run=true", f"results_dir={results}")
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    job = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=2" in job
    launch = (run_dir / "launch-checkpoint.sh").read_text()
    probe = run_dir / "launch-probe.sh"
    probe.write_text(re.sub(r"-m restart_harness\.worker .*$", "-m restart_harness.rank_env", launch,
                            flags=re.MULTILINE))
    script = tmp_path / "probe.sbatch"
    header = [line for line in job.splitlines() if line.startswith("#SBATCH") and "--output" not in line]
    script.write_text("\n".join(["#!/usr/bin/env bash", *header, f"#SBATCH --output={tmp_path}/probe-%j.log",
                                 f"cd {REPO}", f"bash {probe}"]) + "\n")
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=c.env(),
                               check=False, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for_job(c, job_id)
    shown = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True, env=c.env(),
                           check=False).stdout  # an ended job stays shown for MinJobAge (300 s)
    assert "TresPerNode=gres:gpu:2" in shown and "JOB_GRES=gpu:4" in shown, shown  # 2 nodes x 2 GPUs, as asked
    ranks = [json.loads(line) for line in (tmp_path / f"probe-{job_id}.log").read_text().splitlines()
             if line.startswith("{")]
    assert sorted(int(r["RANK"]) for r in ranks) == [0, 1, 2, 3], ranks
    for r in ranks:
        assert r["SLURM_GPUS_ON_NODE"] == "2" and len(r["CUDA_VISIBLE_DEVICES"].split(",")) == 2, r
        assert r["cuda_device"] == int(r["LOCAL_RANK"]) == int(r["RANK"]) % 2, r
        assert r["host"] == f"node{int(r['RANK']) // 2 + 1}" and r["CROSS_RANK"] == str(int(r["RANK"]) // 2), r


def test_more_gpus_a_node_than_the_partition_has_is_one_line_before_submission(gpu_cluster, tmp_path):
    c, _ = gpu_cluster
    results = tmp_path / "results"
    proc = cli(c, "tiny", "dp=8", "nodes=1", "ranks_per_node=8", "launcher=slurm", "device=cuda",
               f"results_dir={results}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "ranks_per_node=8 asks for 8 GPUs on each node" in lines[0] and "at most 4 GPUs a node" in lines[0]
    assert not results.exists()


def test_a_gpu_job_ends_before_any_rank_naming_the_node_that_cannot_run_it(gpu_cluster):
    """The headline layout's shape, small: engine=datastates on device=cuda, submitted from the login node and
    waited for (wait=true). Slurm schedules it with its GPUs; the job's node checks find no NVIDIA driver and no
    DataStates-LLM on the nodes: one line naming the node, in status.json and on the terminal, exit 1; no rank
    started, no checkpoint."""
    c, results = gpu_cluster
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "tiny", "tp=2", "dp=2", "nodes=2",
                           "ranks_per_node=2", "launcher=slurm", "device=cuda", "engine=datastates", "wait=true",
                           "walltime=00:10:00", f"results_dir={results}"], capture_output=True, text=True,
                          env=c.env(), timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"error: node node[12] cannot run the ranks \(and 1 other node\): device=cuda: no NVIDIA driver "
                    r"on this node .*; engine=datastates: Python module 'datastates' is not installed", last), last
    assert re.search(r"\[job \d+\] (pending|running)", proc.stderr) and "ended" in proc.stderr
    (run_dir,) = results.glob("tiny-tp2-pp1-dp2-datastates-*")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["reason"] == last.removeprefix("error: ")
    checked = json.loads((run_dir / "records" / "nodecheck.json").read_text())
    assert sorted(n["host"] for n in checked["nodes"]) == ["node1", "node2"]
    assert all(len((n["cuda_visible_devices"] or "").split(",")) == 2 for n in checked["nodes"])  # the job's GPUs
    assert not (run_dir / "events" / "checkpoint").exists() and not (run_dir / "checkpoint" / "latest").exists()
