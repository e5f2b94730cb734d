"""The local multi-node Slurm cluster (testbeds/slurm_cluster.py) as the tests use it: started for a
test module, stopped afterwards, and checked to have left nothing behind (namespaces, links, daemons, files)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, require_tool
from durations import timed_setup

import testbeds
from testbeds import slurm_cluster as cluster_bed
from testbeds.slurm_cluster import Cluster


@contextmanager
def slurm_cluster(root: Path, nodes: int, gpus: int = 0):
    """A cluster of `nodes` nodes (with `gpus` stand-in GPUs each) under root; yields it. Torn down even when the test
    fails."""
    require_tool(*cluster_bed.BINARIES, package="slurm-wlm, munge, iproute2 and util-linux")
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must not skip: the local Slurm cluster needs root")
        pytest.skip("the local Slurm cluster needs root (network namespaces, a bridge, slurmd)")
    with timed_setup(f"slurm_cluster_{nodes}_nodes" + (f"_{gpus}_gpus" if gpus else "")):
        cluster = cluster_bed.up(root, nodes, cpus=2, gpus=gpus)
    try:
        yield cluster
    finally:
        pids = [p for p in cluster.created["pids"].values() if p]
        cluster_bed.down(root)
        left = cluster_bed.leftovers(cluster.ident)
        alive = [p for p in pids if testbeds.alive(p)]
        files = sorted(str(f.relative_to(root)) for f in root.rglob("*")) if root.exists() else []
        assert not left and not alive and not root.exists(), (left, alive, files[:20])


def cli(cluster: Cluster, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`config-n-run.py ...` from the login node (this host) against the cluster."""
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), *args], check=False, capture_output=True,
                          text=True, env={**cluster.env(), **(env or {})}, timeout=120, cwd=REPO)


def wait_for_job(cluster: Cluster, job_id: str, seconds: int = 400) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=cluster.env(),
                               check=False).stdout
        if job_id not in queue:
            return
        time.sleep(0.5)  # squeue is cheap; a job found ended half a second sooner on average is the module's wall
    raise AssertionError(f"slurm job {job_id} still queued or running after {seconds} s")
