"""Shared by every test: the table of real runs (RUNS), the one fixture that runs the harness (`harness`), the local
S3 server some runs need (`s3_server`), and the rule for tools a test needs (`require_tool`).

A case in RUNS is a sequence of invocations of the real command line (config-n-run.py, the Python entry of
./submit-job.sh): the run, then each of its steps on that run directory - restart-only re-runs at its own layout or
at another (`restart key=value ...`). It is played once per session, the first time a test asks for it, into a
session temporary folder; every case is also held to the checks every run must pass (tests/test_runs.py). Tests
only read the run directories they are given; a test that changes a run makes its own.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# where the time goes: test-logs/durations.json (tests/durations.py); its hooks are this conftest's
from durations import (
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_testnodedown,
    record_case,
    record_case_wait,
    timed_setup,
)

__all__ = ["pytest_runtest_logreport", "pytest_runtest_makereport", "pytest_runtest_setup", "pytest_sessionfinish",
           "pytest_testnodedown"]
# A job a non-interactive shell starts with & begins with SIGINT ignored, and its children inherit that across exec
# (Python then keeps it): the Ctrl-C the interruption tests send would do nothing. A Python handler here is reset to
# the default in every process the tests start.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent


def _baselines_of_this_session() -> None:
    """The tests probe the storage while the suite loads the machine: their baselines go to a cache of this session's
    own, so that a user's runs in this checkout never reuse one for their 24 hours (a study's cells did: "measured 9.1
    h before the run in /tmp/pytest-of-root/..."). Everything else the cache holds (DeepSpeed's built ops, the I/O
    counter, the environments, the test logs) stays shared: this session's cache links to it."""
    import atexit
    import tempfile

    from restart_harness.files.cache_dir import ENV, cache_dir

    real, mine = cache_dir(), Path(tempfile.mkdtemp(prefix="rh-test-cache-"))
    for name in ("torch_extensions", "iocount", "envs", "test-logs"):
        (real / name).mkdir(parents=True, exist_ok=True)
        (mine / name).symlink_to(real / name)
    os.environ[ENV] = str(mine)
    atexit.register(shutil.rmtree, mine, True)  # the links go, not what they point to


_baselines_of_this_session()
SHORT = "iters=2 save_interval=2 after=1"
# The launcher of a case that names none: launcher=prefork imports torch and DeepSpeed once and forks the ranks, where
# every other launcher starts each rank from nothing (about 7 CPU-seconds a rank here, mostly imports: docs/testing.md);
# what the ranks do is the same. The cases that are about a launcher, the README's run (tiny-dp2) and the killed-rank
# faults name theirs (launcher=local and launcher=deepspeed are DeepSpeed's).
CASE_LAUNCHER = "prefork"
# The environment's page cache before a restart, where a run names none: env_cache=keep evicts the checkpoint's files
# one by one and leaves every other page. The default (auto) as root drops the whole machine's page cache and its
# dentries, so the other pytest worker's launch, mid-import, reads its environment back from disk (docs/testing.md);
# the tests about the environment's cache name theirs (tests/test_io_sources.py).
CASE_ENV_CACHE = "keep"
ASYNC_SHORT = "iters=3 save_interval=1 after=1"  # saves at 1, 2, 3: a flush can overlap the next step


@dataclass(frozen=True)
class Step:
    """A restart-only re-run of the case's run directory: `restart key=value ...`, and the exit code it must end with."""

    args: str = ""
    expect: int = 0
    env: tuple[tuple[str, str], ...] = ()  # (name, value) set for this re-run only


@dataclass(frozen=True)
class Case:
    """The command line after ./submit-job.sh, as text; then its steps (a text is a Step that must succeed)."""

    args: str
    then: tuple[Step | str, ...] = ()
    fault: str | None = None  # RH_FAULT for the run (not its steps): worker/../faults.py
    expect: int = 0  # the run's exit code
    needs: str | None = None  # "s3": the local S3 server (s3_server), its settings in the environment
    timeout: int = 900

    @property
    def tokens(self) -> list[str]:
        return case_launcher(self.args.split())

    @property
    def steps(self) -> list[Step]:
        return [Step(s) if isinstance(s, str) else s for s in self.then]


# Layouts x engines x launchers, each one real multi-process launch (checkpoint, then restart in fresh processes).
RUNS: dict[str, Case] = {
    # the spine, default engine
    # (env_cache=auto, the default a user gets: as root its restart drops the machine's page cache, CASE_ENV_CACHE)
    "tiny-dp2": Case("tiny dp=2 engine=default iters=4 save_interval=2 after=2 launcher=local env_cache=auto"),
    # layouts, default engine
    # plain mpiexec (Open MPI) starts the ranks, which take their rank variables from it (tests/test_launchers.py)
    "dp2-short": Case(f"tiny dp=2 launcher=mpiexec {SHORT}"),
    "dp4": Case(f"tiny dp=4 {SHORT}"),
    # tp2-dp2 also traced with dftracer, pp2-dp2 also without the anatomy: neither changes the checkpoint's files,
    # which is what their layout checks read (one launch fewer each than cases of their own)
    "tp2-dp2": Case(f"tiny tp=2 dp=2 trace=true {SHORT}"),
    "pp2-dp2": Case(f"tiny pp=2 dp=2 anatomy=false {SHORT}"),
    "tp2-pp2": Case(f"tiny tp=2 pp=2 baseline=false {SHORT}"),
    "tp2-pp2-dp2": Case(f"tiny tp=2 pp=2 dp=2 {SHORT}"),
    "70B-tp2-pp4-shrink64": Case(f"70B tp=2 pp=4 shrink=64 {SHORT}"),
    # ZeRO stages 2 and 3 (stage 3: a model-states file per data-parallel rank)
    "zero2-dp2": Case(f"tiny dp=2 zero=2 {SHORT}"),
    "zero3-dp2": Case(f"tiny dp=2 zero=3 {SHORT}"),
    "zero3-tp2-dp2": Case(f"tiny tp=2 dp=2 zero=3 {SHORT}"),
    # engines
    "torchsnapshot-dp2": Case(f"tiny dp=2 engine=torchsnapshot {SHORT}"),
    "torchsnapshot-async-tp2-pp2": Case(f"tiny tp=2 pp=2 engine=torchsnapshot async_take=true {ASYNC_SHORT}"),
    "dcp-async-dp2": Case(f"tiny dp=2 engine=dcp async_save=true {ASYNC_SHORT}"),
    "dcp-tp2-pp2": Case(f"tiny tp=2 pp=2 engine=dcp {SHORT}"),
    "none-dp2": Case(f"tiny dp=2 engine=none {SHORT}"),
    # DeepSpeed's FastPersist writer (libaio, O_DIRECT) on its real code path with third_party's CPU work-arounds
    "fastpersist-dp2": Case(f"tiny dp=2 engine=fastpersist {SHORT}"),
    "fastpersist-tp2-pp2-dp2": Case(f"tiny tp=2 pp=2 dp=2 engine=fastpersist {SHORT}"),
    # the PyTorch-native stack: FSDP2 checkpointed by DCP (tests/test_fsdp2.py)
    "fsdp2-async-dp2": Case(f"tiny dp=2 stack=fsdp2 async_save=true {ASYNC_SHORT}"),
    # the harness's own engine; lazy-dp2 is tiny-dp2 with engine=lazy (tests/test_lazy.py compares their files),
    # its model file split over both replicas even at this size
    "lazy-dp2": Case("tiny dp=2 engine=lazy balance_min_mib=0 iters=4 save_interval=2 after=2 attribution=python"),
    # ... and its parts staged in rings of 1 MiB requests (the vocabulary grown so an optimizer file spans several)
    "lazy-tp2-pp2-dp2": Case(f"tiny tp=2 pp=2 dp=2 engine=lazy vocab_size=16384 write_chunk_mib=1 writers=1 "
                             f"staging_mib=1 {SHORT}"),
    # emulation (no model, no training): each beside the real run above it must equal (tests/test_emulate.py)
    "emulated-tiny-dp2": Case("tiny dp=2 engine=default iters=4 save_interval=2 after=2 emulate=true"),
    "emulated-tp2-pp2": Case(f"tiny tp=2 pp=2 baseline=false {SHORT} emulate=true"),
    "emulated-dcp-tp2-pp2": Case(f"tiny tp=2 pp=2 engine=dcp {SHORT} emulate=true"),
    "emulated-zero3-tp2-dp2": Case(f"tiny tp=2 dp=2 zero=3 {SHORT} emulate=true"),
    # restarts at other layouts (tests/test_reshard.py): converted once, each verified against the original files;
    # the run's own restart (restart-01) is the first loss's reference
    "reshard-dp2": Case(f"tiny dp=2 {SHORT}", then=("dp=1", "tp=2 pp=2 dp=1 trace=true")),
    # the PyTorch-native stack restarted at other data-parallel sizes: DCP reshards while it loads
    "fsdp2-dp2": Case(f"tiny dp=2 stack=fsdp2 attribution=python {SHORT}", then=("dp=1", "dp=4")),
    # where each phase's seconds went (tests/test_attribution.py; lazy-dp2 and fsdp2-dp2 are sampled too): DeepSpeed's
    # launcher sampled; then a restart-only re-run whose sampler cannot run, which goes on with phase timings only
    "attribution-dp2": Case(f"tiny dp=2 attribution=python launcher=local {SHORT}",
                            then=(Step(env=(("RH_PY_SPY", "/bin/false"),)),)),
    # the checkpoint phase alone (torchrun), two restart-only re-runs that delete it after, then one refused
    "checkpoint-only-torchrun": Case(f"tiny dp=2 launcher=torchrun phase=checkpoint {SHORT}",
                                     then=("repeats=2 cache=warm keep=false", Step(expect=2))),
    # a rank killed inside its save of global_step4: the run fails, `latest` stays on global_step2, which restarts
    # (checksums=on: the committed save's files carry their sha256, checked before the restart-only re-run)
    # (DeepSpeed's launcher by its other name)
    "killed-mid-save": Case("tiny dp=2 iters=4 save_interval=2 after=1 checksums=on launcher=deepspeed",
                            fault="kill@save:rank=1:step=4",
                            expect=1, then=("",)),
    # a file of the committed save torn after its checksum was taken (same size): the run's restart is refused
    "torn-after-commit": Case(f"tiny dp=2 emulate=true checksums=on baseline=false {SHORT}",
                              fault="tear@commit:rank=1:step=2", expect=1),
    "dcp-async-killed-mid-save": Case("tiny dp=2 engine=dcp async_save=true iters=4 save_interval=2 after=1",
                                      fault="kill@save:rank=1:step=4", expect=1),
    # emulation whose memory budget makes the ranks of the node write one at a time
    "emulated-waves-dp4": Case("tiny dp=4 emulate=true emulate_memory_gib=0.0015 baseline=false iters=2 "
                               "save_interval=2"),
    # checkpoints as objects in a bucket of the local S3 server (tests/test_s3.py)
    "s3-default-dp2": Case(f"tiny dp=2 ckpt_dir=s3://ckpt/runs {SHORT}", needs="s3"),
    "s3-fsdp2-async-dp2": Case(f"tiny dp=2 stack=fsdp2 async_save=true ckpt_dir=s3://ckpt/runs {SHORT}", needs="s3",
                               then=("dp=1",)),
    "s3-pp2": Case(f"tiny pp=2 ckpt_dir=s3://ckpt/runs {SHORT}", needs="s3"),
    "s3-fsdp2-dp2": Case(f"tiny dp=2 stack=fsdp2 ckpt_dir=s3://ckpt/runs {SHORT}", needs="s3"),
    "s3-dcp-dp2": Case(f"tiny dp=2 engine=dcp ckpt_dir=s3://ckpt/runs {SHORT}", needs="s3"),
}


def cases(*names: str) -> list[str]:
    """Names of RUNS, checked (a typo fails at collection, not as a missing run)."""
    unknown = [n for n in names if n not in RUNS]
    assert not unknown, unknown
    return list(names)


def case_launcher(args: list[str]) -> list[str]:
    """The arguments of a run, with launcher=CASE_LAUNCHER and env_cache=CASE_ENV_CACHE where they name none (a
    restart-only re-run keeps its run's; other commands: as they are)."""
    from restart_harness.command.parse import split_command

    if split_command(args)[0] != "run" or any(a.startswith("phase=restart") for a in args):
        return args
    out = list(args)
    if not any(a.startswith("launcher=") for a in args):
        out.append(f"launcher={CASE_LAUNCHER}")
    if not any(a.startswith("env_cache=") for a in args):
        out.append(f"env_cache={CASE_ENV_CACHE}")
    return out


def run_cli(args: list[str], results: Path, timeout: int = 600, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """`config-n-run.py ...` with results_dir=<results>, by the interpreter running pytest; a run that names no
    launcher runs under CASE_LAUNCHER, as the cases do."""
    cmd = [sys.executable, str(REPO / "config-n-run.py"), *case_launcher(args), f"results_dir={results}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def submit(args: list[str], cwd: Path, timeout: int = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """./submit-job.sh exactly as a user types it (the shell entry, its Python chooser included)."""
    return subprocess.run([str(REPO / "submit-job.sh"), *args], cwd=cwd, check=False, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def restart(run_dir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`config-n-run.py restart run=<run_dir> key=value ...`: a restart-only re-run (exit code not checked)."""
    base = {k: v for k, v in os.environ.items() if k != "RH_FAULT"}
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "restart", f"run={run_dir}", *args],
                          check=False, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**base, "PYTHONUNBUFFERED": "1", **(env or {})})


def copy_run(run_dir: Path, dest: Path) -> Path:
    """A run directory copied whole (its checkpoint inside it): a run of its own that a test may change."""
    copy = dest / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy


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
    """Plays the cases of RUNS on demand, once per session. With pytest-xdist (./run-tests.sh runs two workers) the
    workers share one folder of played cases: the first to ask for a case plays it while holding its lock, the others
    wait and read what it recorded (run directory, exit codes, output)."""

    def __init__(self, root: Path, request):
        self.root, self.request = root, request
        self._done: dict[str, tuple[Path, subprocess.CompletedProcess, list[subprocess.CompletedProcess]]] = {}

    def _play(self, name: str):
        case = RUNS[name]
        if case.needs:
            self.request.getfixturevalue(f"{case.needs}_server")
        start = time.time()
        results = self.root / name
        env = {"RH_FAULT": case.fault} if case.fault else None
        first = run_cli(case.tokens, results, timeout=case.timeout, check=case.expect == 0, env=env)
        assert first.returncode == case.expect, f"{name}: exit {first.returncode}\n{first.stderr}"
        (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
        steps = []
        for step in case.steps:
            proc = restart(run_dir, *step.args.split(), env=dict(step.env))
            assert proc.returncode == step.expect, f"{name}: restart {step.args} exited {proc.returncode}\n" + \
                proc.stdout + proc.stderr
            steps.append(proc)
        record_case(name, time.time() - start, 1 + len(steps))
        return run_dir, first, steps

    def _shared(self, name: str):
        """The case as played by whichever worker came first (the lock held while it plays)."""
        import fcntl

        record = self.root / f".{name}.played.json"
        with open(self.root / f".{name}.lock", "w") as lock:
            asked = time.time()
            fcntl.flock(lock, fcntl.LOCK_EX)
            if record.is_file() and time.time() - asked > 1:  # the other worker was playing it meanwhile
                record_case_wait(name, time.time() - asked)
            if not record.is_file():
                run_dir, first, steps = self._play(name)
                procs = [{"args": p.args, "returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
                         for p in (first, *steps)]
                tmp = record.with_suffix(".tmp")
                tmp.write_text(json.dumps({"run_dir": str(run_dir), "procs": procs}))
                os.replace(tmp, record)
                return run_dir, first, steps
        data = json.loads(record.read_text())
        first, *steps = (subprocess.CompletedProcess(**p) for p in data["procs"])
        return Path(data["run_dir"]), first, steps

    def run(self, name: str) -> Path:
        """The case's run directory, after every step."""
        return self.played(name)[0]

    def played(self, name: str) -> tuple[Path, subprocess.CompletedProcess, list[subprocess.CompletedProcess]]:
        """(run directory, the run's process, each step's process)."""
        if name not in self._done:
            self._done[name] = self._shared(name) if WORKER else self._play(name)
        return self._done[name]


WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under pytest-xdist; None in a single process
# tests that must share one worker: its S3 server holds the objects of the cases that need one, and the local Slurm
# cluster's daemons and namespaces are one per machine. Both are one group, one after the other on one worker: their
# tests wait on daemons (a job queued, a node marked down, a gateway restarted), waits the other worker's launches
# fill; side by side on two workers, their waits left a core idle (docs/testing.md)
_GROUPS = {"test_s3.py": "servers", "test_s3_faults.py": "servers", "test_slurm.py": "servers",
           "test_gpu_cluster.py": "servers",
           "test_io_sources.py": "io_sources"}  # one worker: its module fixture's restart runs once
_NEEDS_GROUP = {"s3": "servers"}  # a case that needs the S3 server runs where the server is
# tests that mostly wait (a rank hung until the timeout, a harness killed and its ranks awaited): one group, so that
# they do not wait side by side on both workers at the end of the session
_WAITING = {"test_hung_rank_is_killed_by_the_timeout", "test_killed_harness_leaves_running_which_readers_see_as_failed"}


_PLAYS = re.compile(r"""harness\.(?:run|played)\(["']([\w.-]+)["']\)""")


def case_of(item) -> str | None:
    """The case of RUNS a test reads first: its `name` parameter (or another naming a case), else the first
    `harness.run("...")` in its own source, else in the source of a fixture it requests (tiny_dp2, a module's shared
    run)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    for name in (params.get("name"), *params.values()):  # `name`, or another parameter naming a case (`emulated`)
        if isinstance(name, str) and name in RUNS:
            return name
    defs = getattr(item, "_fixtureinfo", None)
    functions = [item.function] + [d.func for name in item.fixturenames
                                   for d in (defs.name2fixturedefs.get(name, ()) if defs else ())]
    for function in functions:
        try:
            found = _PLAYS.findall(inspect.getsource(function))
        except (OSError, TypeError):  # a builtin fixture
            continue
        if found and found[0] in RUNS:
            return found[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads xdist_group to place --dist loadgroup
def pytest_collection_modifyitems(config, items) -> None:
    """The tests that share a server or a cluster go to one pytest-xdist worker (--dist loadgroup), and so do the
    tests of one case: a test asking for a case the other worker is playing waits with nothing to do, and the
    playing worker's launch alone rarely keeps both cores busy (the durations file's `case_waits_seconds`)."""
    scopes = {}
    for item in items:
        group = _GROUPS.get(item.path.name) or ("waits" if item.originalname in _WAITING else None)
        case = case_of(item)
        if not group and case is not None:
            group = _NEEDS_GROUP.get(RUNS[case].needs) if RUNS[case].needs else f"case-{case}"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        scopes[item] = group or item.nodeid
    items[:] = in_schedule_order(items, scopes)


def in_schedule_order(items: list, scopes: dict) -> list:
    """The order pytest-xdist hands the units out in (run-tests.sh passes --no-loadscope-reorder; a unit is a group,
    or a test of none): the servers group first, the longest chain, whose waits the other worker's launches fill;
    then every unit that launches ranks (a slow test among its tests); the fast tests last, the small pieces that
    even out the two workers' ends. Within a tier, the order of collection. By default pytest-xdist sends the
    groups largest first and every lone test after them in the order of collection: the slow lone tests (the offline
    bundle's 2-3 minutes among them) came last, and one worker waited up to 36 s for the other at the end
    (docs/testing.md)."""
    first: dict[str, int] = {}
    slow: set[str] = set()
    for i, item in enumerate(items):
        first.setdefault(scopes[item], i)
        if item.get_closest_marker("slow"):
            slow.add(scopes[item])

    def tier(scope: str) -> int:
        return 0 if scope == "servers" else 1 if scope in slow else 2

    return sorted(items, key=lambda item: (tier(scopes[item]), first[scopes[item]]))


def one_worker(resource: str, tmp_path_factory) -> None:
    """Under pytest-xdist, a resource the tests of one xdist_group share (the S3 server, a Slurm cluster) is started
    by one worker only. A second worker starting it means the groups were lost (pytest and pytest-xdist versions,
    requirements.txt): fail at once, rather than with objects missing from the other worker's server."""
    if not WORKER:
        return
    claim = tmp_path_factory.getbasetemp().parent / f".{resource}.worker"
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, WORKER.encode())
        os.close(fd)
    except FileExistsError:
        owner = claim.read_text()
        if owner != WORKER:
            pytest.fail(f"{resource}: started by workers {owner} and {WORKER}; its tests must be one xdist_group "
                        "(--dist loadgroup; pytest-xdist's groups work with the pytest of requirements.txt)")


@pytest.fixture(scope="session")
def harness(tmp_path_factory, request) -> Harness:
    base = tmp_path_factory.getbasetemp()
    if WORKER:  # every worker's base is <session base>/<worker>: the played cases live beside them, shared
        root = base.parent / "runs"
        root.mkdir(exist_ok=True)
        return Harness(root, request)
    return Harness(tmp_path_factory.mktemp("runs"), request)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A single-node Ceph RADOS Gateway for the session (testbeds/ceph_s3.py, with the ETag proxy of
    third_party/rgw_multipart_etag.py in front), bucket `ckpt`, its settings in this process's environment (every
    run and restart inherits them, as from a user's shell), stopped at the end."""
    require_tool("radosgw", "ceph-mon", "ceph-osd", package="radosgw ceph-mon ceph-osd ceph-common")
    one_worker("s3_server", tmp_path_factory)
    from testbeds import ceph_s3

    root = Path(f"/tmp/rh-s3-{os.getpid()}")  # short: Ceph's admin sockets live here (108-byte socket paths)
    with timed_setup("s3_server"):
        s3 = ceph_s3.start(root, memory_mib=1024)
    saved = {k: os.environ.get(k) for k in s3.environment()}
    try:
        s3.create_bucket("ckpt")
        os.environ.update(s3.environment())
        yield s3
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        ceph_s3.stop(root)


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
