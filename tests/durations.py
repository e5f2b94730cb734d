"""Where the suite's time goes, written down (a pytest plugin, loaded by conftest.py).

At the end of every session it writes one JSON file: each test's setup, call and teardown seconds and outcome; each
case of the run table (conftest.RUNS) with the seconds its run and steps took (the test that first asks for a case
pays for it, so cases are listed on their own); the shared set-ups the tests time themselves (the S3 server, the
Slurm cluster, DeepSpeed's JIT ops: `timed_setup`); and the set-up steps run-tests.sh timed before pytest started
(system packages, the Python environment; RH_SETUP_TIMES names their file). The file goes to
`test-logs/durations.json` in the checkout and, kept across checkouts (CI's clone is thrown away), to
`$RH_CACHE_DIR/test-logs/durations-<UTC time>-<commit>.json` (default cache: ~/.cache/restart-harness).
`python scripts/test_durations.py [FILE]` summarizes one (docs/testing.md)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCHEMA = 3  # 2: tests carry start, worker and cpu_seconds; 3: machine_cpu_seconds

_tests: dict[str, dict] = {}
_cases: dict[str, dict] = {}
_case_waits: dict[str, float] = {}  # a worker's test waiting while another worker played the case
_setups: dict[str, float] = {}
_started = time.time()
_CPU_AT_SETUP = pytest.StashKey[float]()


def machine_counters() -> list[int] | None:
    """The whole machine's CPU time so far, from /proc/stat's first line, in clock ticks: user nice system idle
    iowait irq softirq steal (None where there is no /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def machine_seconds(before: list[int] | None, after: list[int] | None) -> dict | None:
    """The machine's CPU-seconds between two readings: busy (every process, the tests' and everything else: Slurm's
    ranks, Ceph), idle, iowait and steal (time the host ran something else while this machine wanted a CPU: a busy
    host, whose other work slows this one's too). Two runs' minutes compare only where their steal is alike."""
    if not before or not after:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    d = [(b - a) / tick for a, b in zip(before, after)]
    user, nice, system, idle, iowait, irq, softirq, steal = d
    return {"busy": round(user + nice + system + irq + softirq, 1), "idle": round(idle, 1), "iowait": round(iowait, 1),
            "steal": round(steal, 1)}


_MACHINE_AT_START = machine_counters()


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (a launch's ranks are reaped by their
    launcher, and it by the test: their seconds arrive here when the launch ends)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    item.stash[_CPU_AT_SETUP] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:  # travels with the report to xdist's controller
        outcome.get_result().cpu_seconds = round(_cpu_seconds() - item.stash[_CPU_AT_SETUP], 3)


def pytest_runtest_logreport(report) -> None:
    entry = _tests.setdefault(report.nodeid, {"id": report.nodeid, "outcome": "passed"})
    entry[f"{report.when}_seconds"] = round(report.duration, 3)
    if report.when == "setup":
        entry["start"] = round(report.start, 3)
        node = getattr(report, "node", None)  # pytest-xdist: the worker that ran it
        entry["worker"] = getattr(getattr(node, "gateway", None), "id", None) or "main"
    if getattr(report, "cpu_seconds", None) is not None:
        entry["cpu_seconds"] = report.cpu_seconds
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def record_case(name: str, seconds: float, invocations: int) -> None:
    """A case of the run table was played: its run and each step (conftest.Harness)."""
    _cases[name] = {"seconds": round(seconds, 3), "invocations": invocations}


def record_case_wait(name: str, seconds: float) -> None:
    """A test waited `seconds` for a case another worker was playing (conftest.Harness): time that worker's core
    did nothing (conftest.pytest_collection_modifyitems puts the tests of one case on one worker to avoid it)."""
    _case_waits[name] = round(_case_waits.get(name, 0.0) + seconds, 3)


@contextmanager
def timed_setup(name: str):
    """Time a shared set-up (a server, a cluster, a build) once, under `name`."""
    start = time.time()
    try:
        yield
    finally:
        _setups[name] = round(_setups.get(name, 0.0) + time.time() - start, 3)


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() or "unknown"


def _setup_steps() -> dict:
    path = os.environ.get("RH_SETUP_TIMES")
    if not path or not Path(path).is_file():
        return {}
    out = {}
    for line in Path(path).read_text().splitlines():  # "name seconds" per line, written by run-tests.sh
        name, _, seconds = line.partition(" ")
        if seconds:
            out[name] = float(seconds)
    return out


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist: a worker's cases and shared set-ups reach the controller, which writes the file."""
    got = getattr(node, "workeroutput", {}).get("rh_durations") or {}
    _cases.update(got.get("cases", {}))
    for name, seconds in got.get("case_waits", {}).items():
        record_case_wait(name, seconds)
    for name, seconds in got.get("setups", {}).items():
        _setups[f"{name} ({node.gateway.id})"] = seconds


def pytest_sessionfinish(session, exitstatus) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller has every test's report
        session.config.workeroutput["rh_durations"] = {"cases": _cases, "case_waits": _case_waits,
                                                       "setups": _setups}
        return
    now = time.time()
    commit = _commit()
    data = {
        "schema": SCHEMA,
        "commit": commit,
        "started": _started,
        "finished": now,
        "pytest_wall_seconds": round(now - _started, 3),
        "cpus": os.cpu_count(),
        "machine_cpu_seconds": machine_seconds(_MACHINE_AT_START, machine_counters()),
        "args": list(session.config.invocation_params.args),
        "exit_status": int(exitstatus),
        "setup_steps_seconds": _setup_steps(),
        "shared_setups_seconds": dict(sorted(_setups.items())),
        "cases": dict(sorted(_cases.items(), key=lambda kv: -kv[1]["seconds"])),
        "case_waits_seconds": dict(sorted(_case_waits.items(), key=lambda kv: -kv[1])),
        "tests": sorted(_tests.values(), key=lambda t: t["id"]),
    }
    _write(REPO / "test-logs" / "durations.json", data)
    cache = Path(os.environ.get("RH_CACHE_DIR") or Path.home() / ".cache" / "restart-harness")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    try:
        _write(cache / "test-logs" / f"durations-{stamp}-{commit}.json", data)
    except OSError:  # a read-only home: the checkout's copy is still there
        pass
