"""launcher=slurm across nodes, against a real Slurm of 4 nodes that this module starts and stops
(testbeds/slurm_cluster.py: each node a network namespace with its own hostname, address and slurmd).
sbatch submits the generated job from this host (the login node); the ranks start through srun on the job's nodes
and reach each other over the cluster's bridge; the restart is a second srun step in fresh processes; finalize runs
inside the job into the same run directory. Every multi-node path: tensor parallel within a node and data parallel
across, FSDP2's hybrid sharding, a restart at another node count, emulation over 4 nodes, the page cache on every
node, a lost node, a node that is down, and what Slurm would refuse."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CASE_ENV_CACHE, REPO, events, load_summary, one_worker
from slurm_cluster import cli, slurm_cluster, wait_for_job

pytestmark = pytest.mark.slow
NODES = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    one_worker("slurm_cluster", tmp_path_factory)
    root = tmp_path_factory.mktemp("slurm")
    with slurm_cluster(root / "cluster", NODES) as c:
        yield c, root / "results"


def submitted(cluster, *args: str, env: dict | None = None) -> Path:
    """Submit a run from the login node, wait for its job to end; its run directory."""
    c, results = cluster
    proc = cli(c, *args, "walltime=00:10:00", f"env_cache={CASE_ENV_CACHE}", f"results_dir={results}", env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    wait_for_job(c, json.loads((run_dir / "job.json").read_text())["job_id"])
    return run_dir


def restart_job(cluster, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    c, _ = cluster
    proc = cli(c, "phase=restart", f"run={run_dir}", *args)
    assert proc.returncode == 0, proc.stderr
    n = len(list(run_dir.glob("job-restart-*.json")))
    wait_for_job(c, json.loads((run_dir / f"job-restart-{n}.json").read_text())["job_id"])
    return proc


def host_of(run_dir: Path, record: str) -> dict[int, str]:
    return {r: next(e["host"] for e in evs if e["event"] == "process") for r, evs in events(run_dir, record).items()}


@pytest.fixture(scope="module")
def two_nodes(cluster):
    """DeepSpeed, tp=2 within a node, dp=2 across two nodes; submitted from the login node and waited for
    (wait=true): the command returns when the job has ended, with the run's summary."""
    c, results = cluster
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "tiny", "tp=2", "dp=2", "nodes=2",
                           "ranks_per_node=2", "launcher=slurm", "iters=2", "save_interval=2", "after=1", "wait=true",
                           "walltime=00:10:00", f"results_dir={results}"], capture_output=True, text=True,
                          env=c.env(), timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads((Path(proc.stdout.strip().splitlines()[-1]) / "job.json").read_text())["job_id"]
    assert proc.stdout.startswith(f"job {job_id}\n") and "\nverified           yes (4 ranks" in proc.stdout
    assert f"[job {job_id}] ended" in proc.stderr and "[restart-01] step 3/3" in proc.stderr  # its progress, shown
    return Path(proc.stdout.strip().splitlines()[-1])


def test_job_submitted_and_id_printed(two_nodes):
    job = json.loads((two_nodes / "job.json").read_text())
    assert job["scheduler"] == "slurm" and job["job_id"].isdigit()
    assert (two_nodes / "job.sbatch").is_file() and (two_nodes / "logs" / f"job-{job['job_id']}.log").is_file()
    assert "#SBATCH --nodes=2" in (two_nodes / "job.sbatch").read_text()


def test_tensor_parallel_within_a_node_data_parallel_across(two_nodes):
    summary = load_summary(two_nodes)
    assert summary["status"]["state"] == "complete", summary["status"]
    restart = summary["restart"]
    assert restart["verified"] is True and restart["ranks"] == 4 and restart["tag"] == "global_step2"
    placed = [{"host": "node1", "node": 0, "ranks": [0, 1]}, {"host": "node2", "node": 1, "ranks": [2, 3]}]
    assert summary["checkpoint"]["placement"] == placed and restart["placement"] == placed
    hosts = host_of(two_nodes, "checkpoint")
    layout = {r: next(e for e in evs if e["event"] == "layout") for r, evs in events(two_nodes).items()}
    for a in layout:  # a tensor-parallel pair shares a node; the data-parallel replicas are on different nodes
        for b in layout:
            assert (hosts[a] == hosts[b]) == (layout[a]["dp_rank"] == layout[b]["dp_rank"]), (a, b)


def test_per_node_view_of_the_save_and_the_restart(two_nodes):
    summary = load_summary(two_nodes)
    save = summary["checkpoint"]["saves"][-1]
    nodes = save["per_node"]
    assert [n["host"] for n in nodes] == ["node1", "node2"]
    assert sum(n["bytes"] for n in nodes) == sum(r["bytes"] for r in save["per_rank"])
    by_rank = {r["rank"]: r for r in save["per_rank"]}
    for n in nodes:
        slowest = max(n["ranks"], key=lambda r: by_rank[r]["durable_seconds"])
        assert n["slowest_rank"] == slowest and n["durable_seconds"] == by_rank[slowest]["durable_seconds"]
        assert 1 <= n["concurrent_writers_max"] <= n["writers"] <= 2
    worst = max(nodes, key=lambda n: n["durable_seconds"])
    assert save["slowest_node"] == {"host": worst["host"], "rank": worst["slowest_rank"],
                                    "seconds": worst["durable_seconds"]}
    restart = summary["restart"]
    assert [n["host"] for n in restart["per_node"]] == ["node1", "node2"]
    assert restart["slowest_node"]["seconds"] == restart["total_seconds"]
    # the page cache: dropped and observed on every node, each its own record (the default, env_cache=auto:
    # drop_caches as root; env_cache=keep goes file by file on every node, test_a_lost_node...)
    cache = restart["cache"]
    assert [n["host"] for n in cache["per_node"]] == ["node1", "node2"]
    assert all(n["method"] == "drop_caches" and n["observed"] == "cold" for n in cache["per_node"])


def test_restart_is_a_separate_srun_step_in_fresh_processes(two_nodes):
    checkpoint = json.loads((two_nodes / "records" / "checkpoint.json").read_text())
    ended = checkpoint["start"] + checkpoint["wall_seconds"]
    for path in (two_nodes / "events" / "restart-01").glob("rank-*.jsonl"):
        evs = [json.loads(line) for line in path.read_text().splitlines()]
        start = next(e["t"] for e in evs if e["event"] == "mark" and e["name"] == "process_start")
        assert start > ended  # started after every checkpoint rank had exited
    assert "srun" in (two_nodes / "launch-restart-01.sh").read_text()


def test_restart_at_another_node_count_is_a_job_of_its_own(cluster, two_nodes):
    proc = restart_job(cluster, two_nodes, "nodes=4", "ranks_per_node=1", "cache=warm")
    job = json.loads((two_nodes / "job-restart-1.json").read_text())
    assert f"job {job['job_id']}" in proc.stdout.splitlines() and "verified" not in proc.stdout
    assert "--nodes=4" in (two_nodes / "job-restart-1.sbatch").read_text()
    summary = load_summary(two_nodes)
    assert [r["record"] for r in summary["restarts"]] == ["restart-01", "restart-02"]
    latest = summary["restart"]
    assert latest["verified"] is True and latest["cache"]["requested"] == "warm"
    assert [(n["host"], n["ranks"]) for n in latest["placement"]] == [(f"node{i + 1}", [i]) for i in range(4)]
    assert json.loads((two_nodes / "records" / "restart-02.json").read_text())["launcher"] == "slurm"


def test_the_report_shows_placement_and_per_node_figures(two_nodes, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "analysis", str(two_nodes), "-o", str(out)], capture_output=True,
                          text=True, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    md = (out / "report.md").read_text()
    table = md.split("## Placement and per-node figures")[1].split("\n## ")[0]
    for phase, node, ranks in (("save global_step2", "node1", "0-1"), ("save global_step2", "node2", "2-3"),
                               ("restart-02", "node4", "3")):  # the slowest node of each is marked so
        assert re.search(rf"\| {phase} \| {node}( \(slowest\))? \| {ranks} \|", table), table
    header, *rows = (out / "runs.csv").read_text().splitlines()
    cols = header.split(",")
    counts = [row.split(",")[cols.index("restart_nodes_count")] for row in rows]
    assert counts == ["2", "4"] and all(r.split(",")[cols.index("save_nodes_count")] == "2" for r in rows)


@pytest.mark.parametrize("launcher, started_by, phase", [
    ("torchrun", "torch.distributed.run", "all"),  # one torchrun per node, a static rendezvous on the first node
    # DeepSpeed's own multi-node launch, its slurm launcher (its restart launch is the same command)
    ("local", "deepspeed.launcher.runner --hostfile", "checkpoint"),
])
def test_other_launchers_across_nodes_inside_an_allocation(cluster, launcher, started_by, phase):
    """From inside an allocation (salloc runs the harness on the login node), torchrun and DeepSpeed's launcher
    start their ranks on the allocation's nodes through srun; no ssh anywhere."""
    c, results = cluster
    cmd = ["salloc", "-N2", "--ntasks-per-node=1", sys.executable, str(REPO / "config-n-run.py"), "tiny", "dp=2",
           "nodes=2", "ranks_per_node=1", f"launcher={launcher}", "iters=2", "save_interval=2", "after=1",
           f"phase={phase}", f"env_cache={CASE_ENV_CACHE}", f"results_dir={results}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=c.env(), timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete"
    def one_rank_a_node(placement):  # whichever two of the cluster's nodes salloc gave (a node still completing
        hosts = [n["host"] for n in placement]  # the previous test's job is passed over)
        assert len(set(hosts)) == 2 and all(h.startswith("node") for h in hosts), placement
        assert [(n["node"], n["ranks"]) for n in placement] == [(0, [0]), (1, [1])]
    one_rank_a_node(summary["checkpoint"]["placement"])
    if phase == "all":
        assert summary["restart"]["verified"] is True
        assert summary["restart"]["placement"] == summary["checkpoint"]["placement"]  # one allocation, both phases
    script = (run_dir / "launch-checkpoint.sh").read_text()
    assert started_by in script and "srun" in script + (run_dir / "logs" / "checkpoint.log").read_text()
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("rh-hostfile.*"))  # DeepSpeed's hostfile removed


def test_fsdp2_shards_within_a_node_and_replicates_across(cluster):
    run_dir = submitted(cluster, "tiny", "stack=fsdp2", "engine=dcp", "nodes=2", "ranks_per_node=2", "dp=4",
                        "launcher=slurm", "iters=2", "save_interval=2", "phase=checkpoint")
    assert load_summary(run_dir)["status"]["state"] == "complete"
    hosts = host_of(run_dir, "checkpoint")
    layout = {r: next(e for e in evs if e["event"] == "layout") for r, evs in events(run_dir).items()}
    for r, lay in layout.items():  # replica = node, shard = the rank's place within its node
        assert lay["replicate_rank"] == int(hosts[r][-1]) - 1 and lay["shard_rank"] == r % 2
    restart_job(cluster, run_dir)  # phase=checkpoint, then the restart as a Slurm job of its own
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] is True and summary["restart"]["ranks"] == 4
    assert len({n["host"] for n in summary["restart"]["placement"]}) == 2  # two nodes, whichever were free


def test_emulation_over_four_nodes_in_waves_per_node(cluster):
    # 1 MiB of file state a node may hold, files of ~1.5 MB: each node's 2 ranks write one after the other
    run_dir = submitted(cluster, "tiny", "dp=8", "nodes=4", "ranks_per_node=2", "emulate=true",
                        "emulate_memory_gib=0.001", "launcher=slurm", "iters=2", "save_interval=2",
                        "phase=checkpoint")  # the emulated restart's reads: test_emulate.py
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete"
    save = summary["checkpoint"]["saves"][-1]
    assert [(n["host"], n["ranks"]) for n in save["per_node"]] == [(f"node{i + 1}", [2 * i, 2 * i + 1])
                                                                    for i in range(4)]
    saved = {r: next(e for e in evs if e["event"] == "save") for r, evs in events(run_dir).items()}
    for e in saved.values():
        assert e["emulated"] is True and e["waves"] == 2
    for node in save["per_node"]:  # the node's second rank starts its wave after the first's files were written
        first, second = (saved[r] for r in node["ranks"])
        assert second["wave_start"] >= first["wave_end"] >= first["wave_start"] + sum(f["seconds"] for f in first["files"])
        assert node["concurrent_writers_max"] == 1  # one writer at a time on each node


def test_a_lost_node_fails_the_job_naming_it_and_the_last_checkpoint_restarts(cluster):
    # every rank of node 2 (node index 1) is SIGKILLed inside the save of global_step4, after its first file
    run_dir = submitted(cluster, "tiny", "dp=2", "nodes=2", "ranks_per_node=1", "launcher=slurm", "iters=4",
                        "save_interval=2", "after=1", env={"RH_FAULT": "kill@save:node=1:step=4"})
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed", status
    assert status["reason"].startswith("checkpoint phase failed: rank 1 on node2 (all 1 of its ranks): Killed "
                                       "after step 4"), status["reason"]
    assert "last committed save global_step2" in status["reason"]
    assert (run_dir / "checkpoint" / "latest").read_text().strip() == "global_step2"
    restart_job(cluster, run_dir)
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] is True and summary["restart"]["tag"] == "global_step2"
    # env_cache=keep (submitted()): every node evicted the checkpoint's files alone, no node dropped its whole cache
    cache = summary["restart"]["cache"]
    assert len({n["host"] for n in cache["per_node"]}) == 2, cache
    assert all(n["method"] == "posix_fadvise_dontneed" and n["observed"] == "cold" for n in cache["per_node"]), cache


@pytest.mark.parametrize("args, named", [
    (["queue=nosuchpartition"], "sbatch --test-only refuses the job"),
    (["dp=4", "ranks_per_node=4", "nodes=1"], "sbatch --test-only refuses the job"),  # 4 tasks on a 2-CPU node
    (["dp=5", "nodes=5", "ranks_per_node=1"], "nodes=5, but the default partition has 4 nodes"),
])
def test_a_job_slurm_would_refuse_is_one_line_before_anything_exists(cluster, tmp_path, args, named):
    c, _ = cluster
    results = tmp_path / "results"
    proc = cli(c, "tiny", "launcher=slurm", *args, f"results_dir={results}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
    assert not results.exists()


def test_a_node_that_is_down_is_one_line_before_anything_exists(cluster, tmp_path):
    """Last in the module: node4's slurmd is stopped, and Slurm marks the node not responding."""
    c, _ = cluster
    os.kill(c.slurmd_pid("node4"), signal.SIGKILL)
    deadline = time.time() + 90
    while time.time() < deadline and "*" not in c.states().get("node4", ""):
        time.sleep(2)
    assert "*" in c.states()["node4"], c.states()
    results = tmp_path / "results"
    proc = cli(c, "tiny", "dp=4", "nodes=4", "ranks_per_node=1", "launcher=slurm", f"results_dir={results}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "nodes=4, but only 3 of the default partition's 4 nodes can run a job now (node4 " in lines[0], lines[0]
    assert not results.exists()
