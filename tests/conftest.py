"""Shared by every test: the table of real runs (RUNS), the one fixture that runs the harness (`harness`), and the
rule for tools a test needs (`require_tool`).

A run in RUNS is launched once per session, the first time a test asks for it, through the real command line
(config-n-run.py, the Python entry of ./submit-job.sh), into a session temporary folder. Tests only read the run
directories they are given; a test that changes a run (restart-only re-runs, keep=false) makes its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHORT = "iters=2 save_interval=2 after=1"
ASYNC_SHORT = "iters=3 save_interval=1 after=1"  # saves at 1, 2, 3: a flush can overlap the next step


@dataclass(frozen=True)
class Case:
    """One real run: the command line after ./submit-job.sh, as text."""

    args: str
    timeout: int = 900

    @property
    def tokens(self) -> list[str]:
        return self.args.split()


# Layouts x engines x launchers, each one real multi-process launch (checkpoint, then restart in fresh processes).
RUNS: dict[str, Case] = {
    # the spine, default engine
    "tiny-dp2": Case("tiny dp=2 engine=default iters=4 save_interval=2 after=2"),
    # layouts, default engine
    "dp4": Case(f"tiny dp=4 {SHORT}"),
    "tp2-dp2": Case(f"tiny tp=2 dp=2 {SHORT}"),
    "pp2-dp2": Case(f"tiny pp=2 dp=2 {SHORT}"),
    "tp2-pp2": Case(f"tiny tp=2 pp=2 baseline=false {SHORT}"),
    "tp2-pp2-dp2": Case(f"tiny tp=2 pp=2 dp=2 {SHORT}"),
    "70B-tp2-pp4-shrink64": Case(f"70B tp=2 pp=4 shrink=64 {SHORT}"),
    # engines
    "torchsnapshot-dp2": Case(f"tiny dp=2 engine=torchsnapshot {SHORT}"),
    "torchsnapshot-async-tp2-pp2": Case(f"tiny tp=2 pp=2 engine=torchsnapshot async_take=true {ASYNC_SHORT}"),
    "dcp-async-dp2": Case(f"tiny dp=2 engine=dcp async_save=true {ASYNC_SHORT}"),
    "dcp-tp2-pp2": Case(f"tiny tp=2 pp=2 engine=dcp {SHORT}"),
    "none-dp2": Case(f"tiny dp=2 engine=none {SHORT}"),
    # the PyTorch-native stack: FSDP2 checkpointed by DCP (tests/test_fsdp2.py)
    "fsdp2-async-dp2": Case(f"tiny dp=2 stack=fsdp2 async_save=true {ASYNC_SHORT}"),
    # the harness's own engine; lazy-dp2 is tiny-dp2 with engine=lazy (tests/test_lazy.py compares their files),
    # its model file split over both replicas even at this size
    "lazy-dp2": Case("tiny dp=2 engine=lazy balance_min_mib=0 iters=4 save_interval=2 after=2"),
    "lazy-tp2-pp2-dp2": Case(f"tiny tp=2 pp=2 dp=2 engine=lazy {SHORT}"),
    # emulation (no model, no training): each beside the real run above it must equal (tests/test_emulate.py)
    "emulated-tiny-dp2": Case("tiny dp=2 engine=default iters=4 save_interval=2 after=2 emulate=true"),
    "emulated-tp2-pp2": Case(f"tiny tp=2 pp=2 baseline=false {SHORT} emulate=true"),
    "emulated-dcp-tp2-pp2": Case(f"tiny tp=2 pp=2 engine=dcp {SHORT} emulate=true"),
    # observation: every POSIX I/O call traced with dftracer
    "traced-tp2-dp2": Case(f"tiny tp=2 dp=2 trace=true {SHORT}"),
}


def cases(*names: str) -> list[str]:
    """Names of RUNS, checked (a typo fails at collection, not as a missing run)."""
    unknown = [n for n in names if n not in RUNS]
    assert not unknown, unknown
    return list(names)


def run_cli(args: list[str], results: Path, timeout: int = 600, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """`config-n-run.py ...` with results_dir=<results>, by the interpreter running pytest."""
    cmd = [sys.executable, str(REPO / "config-n-run.py"), *args, f"results_dir={results}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def submit(args: list[str], cwd: Path, timeout: int = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """./submit-job.sh exactly as a user types it (the shell entry, its Python chooser included)."""
    return subprocess.run([str(REPO / "submit-job.sh"), *args], cwd=cwd, check=False, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def restart(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`config-n-run.py restart run=<run_dir> key=value ...`: a restart-only re-run (exit code not checked)."""
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "restart", f"run={run_dir}", *args],
                          check=False, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run_dir_of(proc: subprocess.CompletedProcess) -> Path:
    """The last line printed is the run directory."""
    return Path(proc.stdout.strip().splitlines()[-1])


def load_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def events(run_dir: Path, record: str = "checkpoint") -> dict[int, list[dict]]:
    """rank -> its events of one record."""
    out = {}
    for path in sorted((run_dir / "events" / record).glob("rank-*.jsonl")):
        out[int(path.stem.split("-")[1])] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


class Harness:
    """Launches RUNS on demand, once per session."""

    def __init__(self, root: Path):
        self.root = root
        self._done: dict[str, Path] = {}

    def run(self, name: str) -> Path:
        if name not in self._done:
            case = RUNS[name]
            self._done[name] = run_dir_of(run_cli(case.tokens, self.root / name, timeout=case.timeout))
        return self._done[name]


@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Harness:
    return Harness(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(scope="session")
def tiny_dp2(harness) -> Path:
    """The spine's run, read by many tests: tiny dp=2, default engine."""
    return harness.run("tiny-dp2")


def require_tool(*programs: str, package: str) -> None:
    """Skip (saying which tool and which Debian package) when a program is missing; under CI=true, fail instead:
    CI installs every package in scripts/apt/*.txt, so a missing tool there is a broken install step."""
    missing = [p for p in programs if not (shutil.which(p) or any(os.access(f"{d}/{p}", os.X_OK)
                                                                  for d in ("/usr/sbin", "/sbin")))]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed (Debian package {package}, scripts/apt/)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must not skip: {message}")
    pytest.skip(message)
