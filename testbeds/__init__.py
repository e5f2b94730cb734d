"""Test servers the harness is tried against where users have the real thing: a local Slurm cluster of network-namespace
nodes (slurm_cluster.py) and a local Ceph RADOS Gateway for S3 (ceph_s3.py). Used by the tests, the benchmarks and
scripts/local-cluster.sh and scripts/local-s3.sh; not part of the installed harness and never imported by it. Here:
what both servers' daemons need."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Is the process there (a zombie, e.g. a child of ours not waited for, is gone for our purpose)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def terminate(pids: list[int], timeout: float, sig: int = signal.SIGTERM) -> None:
    """sig to each process, then SIGKILL to those still alive after timeout seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in filter(alive, pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
