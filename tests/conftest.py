"""Shared helpers: run the real command line (submit-job.sh's Python entry) into a temporary results folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def run_cli(args: list[str], results: Path, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    """`config-n-run.py MODEL key=value ...` with results_dir=<results>; the interpreter running pytest."""
    cmd = [sys.executable, str(REPO / "config-n-run.py"), *args, f"results_dir={results}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_dir_of(proc: subprocess.CompletedProcess) -> Path:
    """The last line printed is the run directory."""
    return Path(proc.stdout.strip().splitlines()[-1])


def load_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(scope="session")
def session_results(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="session")
def tiny_dp2(session_results: Path) -> Path:
    """One real run shared by tests that only read its files: tiny dp=2, default engine."""
    proc = run_cli(["tiny", "dp=2", "engine=default", "iters=4", "save_interval=2", "after=2"], session_results)
    return run_dir_of(proc)
