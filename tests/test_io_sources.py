"""A restart's I/O by source (rhio.c's source counters, worker/io_marks.py, results/io_sources.py): each path in
the source its prefix says, on a preloaded child; the spine run's restart reading its imports from the Python
environment and its checkpoint only while loading; and the counters checked against the kernel's own view of a real
restart, taken with strace (iocount/strace.py). Every run-table case's figures: tests/test_runs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, copy_run, load_summary, require_tool, submit

from restart_harness import iocount
from restart_harness.iocount import strace
from restart_harness.results import terminal
from restart_harness.schema import io_metadata_ops

CHILD = r"""
import json, os, sys
from restart_harness import iocount
c = iocount.Counters()
root = sys.argv[1]
def step(name, action):
    before = c.sources()
    action()
    after = c.sources()
    out[name] = {s: {k: after[s][k] - before[s][k] for k in after[s] if after[s][k] != before[s][k]} for s in after}
    out[name] = {s: d for s, d in out[name].items() if d}
def read():
    with open(f"{root}/a/f", "rb") as f:
        f.read()
def missing():
    try:
        os.stat(f"{root}/deep/b/missing")
    except FileNotFoundError:
        pass
def relative():
    fd = os.open(f"{root}/a", os.O_RDONLY)
    os.stat("f", dir_fd=fd)
    os.close(fd)
out = {}
step("read", read)
step("missing", missing)
step("listing", lambda: os.listdir(f"{root}/a"))
step("ancestor", lambda: os.stat(f"{root}/deep"))
step("elsewhere", lambda: os.stat("/"))
step("above_inside_another", lambda: os.stat(f"{root}/s/deeper"))
step("relative", relative)
print(json.dumps(out))
"""


def test_each_path_is_counted_in_its_source(tmp_path):
    """Reads, failed stats, listings, a folder above a source that takes them and a path relative to a descriptor,
    each in its source; and the Python reading of RH_IO_SOURCES puts every path where rhio.c does."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 1000)
    (tmp_path / "deep" / "b").mkdir(parents=True)
    (tmp_path / "s" / "deeper" / "c").mkdir(parents=True)
    value = iocount.sources_variable({"a": [str(tmp_path / "a")], "s": [str(tmp_path / "s")],
                                      "b": [str(tmp_path / "deep" / "b"), str(tmp_path / "s" / "deeper" / "c")]},
                                     ("b",))
    env = {**os.environ, "LD_PRELOAD": str(iocount.build()), iocount.ENV_SOURCES: value}
    out = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, capture_output=True,
                                    text=True, check=True, timeout=60, cwd=REPO).stdout)
    assert out["read"]["a"]["opens"] == 1 and out["read"]["a"]["read_bytes"] == 1000, out["read"]
    assert set(out["read"]) == {"a"}, out["read"]
    assert out["missing"] == {"b": {"metadata_calls": 1, "metadata_failures": 1}}, out["missing"]
    assert out["listing"]["a"]["listings"] == 1 and set(out["listing"]) == {"a"}, out["listing"]
    assert out["ancestor"] == {"b": {"metadata_calls": 1}}, out["ancestor"]  # b takes the folders above it
    assert out["elsewhere"] == {"b": {"metadata_calls": 1}}, out["elsewhere"]  # "/" is above every folder
    # a folder above b's prefix takes b's source even inside s's prefix (a staged copy in /dev/shm: /dev/shm)
    assert out["above_inside_another"] == {"b": {"metadata_calls": 1}}, out["above_inside_another"]
    assert out["relative"]["a"]["opens"] == 1 and out["relative"]["a"]["metadata_calls"] == 1, out["relative"]
    table = iocount.SourceTable.parse(value)
    for path, source in ((f"{tmp_path}/a/f", "a"), (f"{tmp_path}/deep/b/x", "b"), (f"{tmp_path}/deep", "b"),
                         ("/", "b"), (f"{tmp_path}/ab", iocount.OTHER), (f"{tmp_path}/a", "a"),
                         (f"{tmp_path}/s/deeper", "b"), (f"{tmp_path}/s/deeper/c/x", "b"), (f"{tmp_path}/s/g", "s")):
        assert table.source_of(path) == source, path


@pytest.mark.slow
def test_the_spine_restart_reads_its_imports_from_the_environment(tiny_dp2):
    """tiny dp=2's restart: every phase's I/O by source, the imports' from the Python environment, the checkpoint
    read in checkpoint_load alone; the calls the counters saw never exceed what the kernel counted."""
    summary = load_summary(tiny_dp2)
    rs = summary["restart"]
    io = rs["io_sources"]
    assert io["ranks"] == rs["ranks"] == 2
    assert list(io["phases"]) == ["imports", "dist_init", "model_build", "engine_init", "checkpoint_load",
                                  "first_step"]
    imports = io["phases"]["imports"]["sources"]
    env = imports["environment"]
    assert env["opens"] > 2 * 300 and env["metadata_calls"] > 2 * 3000 and env["read_bytes"] > 2 * 2**20, env
    ops = {name: io_metadata_ops(c) for name, c in imports.items()}
    assert ops["environment"] >= 0.9 * sum(ops.values()), ops
    assert env["mapped_files"] > 2 * 10, env  # torch's libraries, mapped by the dynamic loader
    for phase, figures in io["phases"].items():
        read = figures["sources"].get("checkpoint", {}).get("read_bytes", 0)
        assert (read > 0) == (phase == "checkpoint_load"), (phase, figures["sources"].get("checkpoint"))
    loaded = io["phases"]["checkpoint_load"]["sources"]["checkpoint"]
    assert loaded["read_bytes"] >= summary["checkpoint"]["bytes"], loaded  # every rank reads the model file too
    counted = sum(c.get("read_bytes", 0) for c in io["total"]["sources"].values())
    kernel = io["total"]["kernel"]["read_chars"]
    assert 0.9 * kernel <= counted <= kernel, (counted, kernel)
    assert set(io["filesystems"]) >= {"environment", "checkpoint", "run_dir"}, io["filesystems"]
    assert "restart I/O        per rank" in terminal.render(summary)


def test_env_cache_drops_and_warms_an_environments_libraries(tmp_path):
    """pagecache.environment() on a folder standing for an environment: drop (file by file, as with cache=warm)
    leaves its libraries cold, warm reads them back; auto does nothing and says what the checkpoint's step did."""
    from restart_harness.files import pagecache

    env = tmp_path / "env"
    (env / "lib").mkdir(parents=True)
    for name in ("libtorch_fake.so", "libc10_fake.so.1", "module.py"):
        (env / "lib" / name).write_bytes(os.urandom(256 * 1024))
    with open(env / "lib" / "libtorch_fake.so", "rb") as f:
        f.read()
    dropped = pagecache.environment([str(env)], "drop", {"method": None}, per_file=True)
    assert (dropped["libraries"], dropped["files"], dropped["bytes"]) == (2, 3, 512 * 1024), dropped
    assert dropped["method"] == "posix_fadvise_dontneed" and dropped["observed"] == "cold", dropped
    warmed = pagecache.environment([str(env)], "warm", {"method": None})
    assert warmed["method"] == "read" and warmed["observed"] == "warm", warmed
    auto = pagecache.environment([str(env)], "auto", {"method": "drop_caches"})
    assert auto["observed"] is None and "drop_caches" in auto["method"] and "evicted" in auto["why"], auto


def test_env_cache_keep_evicts_the_checkpoint_file_by_file_and_leaves_the_rest(tmp_path):
    """env_cache=keep (the test cases' setting, conftest.CASE_ENV_CACHE): the restart's cache step evicts the
    checkpoint's files alone (posix_fadvise, never drop_caches, even as root); a library beside them stays resident,
    and the environment's step does nothing of its own."""
    from restart_harness.files import pagecache

    ckpt, env = tmp_path / "checkpoint", tmp_path / "env"
    ckpt.mkdir()
    env.mkdir()
    files = []
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_optim_states.pt"):
        (ckpt / name).write_bytes(os.urandom(512 * 1024))
        files.append(ckpt / name)
    library = env / "libkept.so"
    library.write_bytes(os.urandom(512 * 1024))
    for path in (*files, library):
        path.read_bytes()
    assert pagecache.resident_bytes(library) == 512 * 1024
    state = pagecache.prepare(files, "drop", per_file=True)  # what phases/restart.py asks for under env_cache=keep
    assert state["method"] == "posix_fadvise_dontneed" and state["observed"] == "cold", state
    assert pagecache.resident_bytes(library) == 512 * 1024  # every other page left as it was
    kept = pagecache.environment([str(env)], "keep", state)
    assert kept["requested"] == "keep" and kept["method"] is None and kept["observed"] is None, kept
    assert "left as they were" in kept["why"]


@pytest.fixture(scope="module")
def staged_traced(harness, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One restart-only re-run of a copy of fsdp2-dp2 that the checks below share: its ranks started by mpiexec
    (each execs its own interpreter), from a copy of the environment in /dev/shm (env_stage; FSDP2 builds no JIT op,
    which a copy would rebuild), the environment's page cache dropped (env_cache=drop), under strace (RH_STRACE=1)."""
    require_tool("strace", package="strace")
    run_dir = copy_run(harness.run("fsdp2-dp2"), tmp_path_factory.mktemp("staged"))
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "restart", f"run={run_dir}",
                           "launcher=mpiexec", "env_stage=/dev/shm", "env_cache=drop"], capture_output=True, text=True,
                          timeout=900, cwd=REPO, check=False,
                          env={**{k: v for k, v in os.environ.items() if k != "RH_FAULT"}, strace.ENV: "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_dir, proc


@pytest.mark.slow
def test_the_counters_agree_with_strace_on_a_restart(staged_traced):
    """Per rank, the counters' opens and metadata calls are at most strace's and at least 95% of them. The rest is
    the dynamic loader's search for libraries and glibc's calls to itself, which no preloaded library sees
    (docs/measurements.md#io-by-source)."""
    run_dir, _ = staged_traced
    record = load_summary(run_dir)["restart"]["record"]
    rows = strace.compare(run_dir, record)
    assert [r["rank"] for r in rows] == [0, 1], rows
    for r in rows:
        assert r["counted_opens"] <= r["strace_opens"] and r["opens_seen_ratio"] >= 0.95, r
        assert r["counted_metadata_calls"] <= r["strace_metadata_calls"] and r["metadata_seen_ratio"] >= 0.95, r
        assert r["strace_opens"] > 1000, r  # a whole rank's life was traced, its imports included
    printed = subprocess.run([sys.executable, "-m", "restart_harness.iocount.strace", str(run_dir), record],
                             capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert f"{record}: rank  strace opens" in printed


@pytest.mark.slow
def test_restarts_started_otherwise_are_not_pooled_into_one_median(staged_traced):
    """The copy's restarts at its own layout: the case's (prefork, env_cache=keep) and this re-run (mpiexec, the
    environment dropped and staged). The terminal gives each its own median, never one over both; every restart's
    row names how it started, and summary.json each restart's launcher."""
    run_dir, proc = staged_traced
    summary = load_summary(run_dir)
    own = [r for r in summary["restarts"] if r["layout"]["loaded"] == r["layout"]["saved"]]
    assert [r["launcher"] for r in own] == ["prefork", "mpiexec"], [r["record"] for r in own]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("restarts "))
    assert row.count(" over 1 (") == 2 and "not pooled" in row, row
    assert "(prefork, cache drop, env_cache keep)" in row and "(mpiexec, cache drop, env_cache drop, staged)" in row
    assert f"  {own[-1]['record']}" in proc.stdout and "(mpiexec, cache drop, env_cache drop, staged), cache" \
        in proc.stdout
    # the report likewise: one configuration per way of starting, runs.csv naming each restart's own
    from analysis import load as ld
    from analysis import table

    runs, _ = ld.load([run_dir])
    groups = table.groups(runs)
    assert len(groups) == 2 and [len(g.rows) for g in groups] == [1, 1], [g.full_label for g in groups]
    assert "launcher=prefork" in groups[0].extra and "launcher=mpiexec" in groups[1].extra, groups[1].extra
    assert "env_cache=drop" in groups[1].extra and "staged=True" in groups[1].extra, groups[1].extra
    assert len(groups[0].resharded) == 2  # dp=1 and dp=4: with the run's own configuration, shown apart
    rows = {r["restart_record"]: r for r in table.rows(runs)}
    assert rows[own[-1]["record"]]["restart_launcher"] == "mpiexec"
    assert rows[own[-1]["record"]]["restart_env_cache_requested"] == "drop" and rows[own[-1]["record"]]["restart_staged"]


@pytest.mark.slow
def test_a_staged_restart_imports_from_the_copy_and_leaves_nothing(staged_traced):
    """env_stage: the copy's time, files and file system recorded; the ranks run the copy's interpreter and import
    from it; the copy is gone once the restart has ended. env_cache=drop acted on the copy (on tmpfs its pages are
    its storage: they stay)."""
    run_dir, proc = staged_traced
    rs = load_summary(run_dir)["restart"]
    staged = rs["staging"]
    assert staged["seconds"] > 0 and staged["files"] > 1000 and staged["bytes"] > 100 * 2**20, staged
    assert staged["filesystem"] == {"mount": "/dev/shm", "type": "tmpfs"}, staged
    assert f"{staged['folder']}/env/bin/" in (run_dir / f"launch-{rs['record']}.sh").read_text()
    assert not Path(staged["folder"]).exists(), staged["folder"]
    io = rs["io_sources"]
    assert io["filesystems"]["environment"] == "tmpfs on /dev/shm", io["filesystems"]
    imports = io["phases"]["imports"]["sources"]
    ops = {name: io_metadata_ops(c) for name, c in imports.items()}
    assert ops["environment"] >= 0.95 * sum(ops.values()), ops  # the copy and the folders above it (/dev, /dev/shm)
    env = rs["environment_cache"]
    assert env["requested"] == "drop" and env["method"] and env["libraries"] > 50, env
    assert "staging the environment into tmpfs" in proc.stdout  # the summary's restart row
    assert f"staged {staged['files']:,} files" in proc.stderr  # the progress line


def test_a_staging_folder_too_small_is_refused_before_anything(tmp_path):
    """A folder with less room than the environment: one line naming both sizes, exit 2, no run folder."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        proc = submit(["tiny", f"env_stage={small}", f"results_dir={tmp_path / 'results'}"], cwd=tmp_path)
    finally:
        subprocess.run(["umount", str(small)], check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"env_stage={small}: 0.01 GiB free" in lines[0], proc.stderr
    assert not (tmp_path / "results").exists()


HARNESS = r"""
import subprocess, sys, time
ranks = subprocess.Popen(["sleep", "600"], start_new_session=True)
subprocess.Popen([sys.executable, "-m", "restart_harness.phases.session", str(ranks.pid), str(__import__("os").getpid()),
                  sys.argv[1]], start_new_session=True)
print(ranks.pid, flush=True)
time.sleep(600)
"""


def test_a_staged_copy_does_not_outlive_a_killed_harness(tmp_path):
    """The harness killed outright while its ranks run: the watchdog (phases/session.py) ends the ranks and removes
    the environment's copy it was given."""
    import signal
    import time

    copy = tmp_path / "rh-env-copy"
    (copy / "env" / "lib").mkdir(parents=True)
    (copy / "env" / "lib" / "libx.so").write_bytes(b"x" * 4096)
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(copy)], stdout=subprocess.PIPE, text=True,
                               cwd=REPO)
    ranks = int(harness.stdout.readline())
    time.sleep(1.0)  # the watchdog arms its death signal
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    for _ in range(100):
        if not copy.exists() and not Path(f"/proc/{ranks}").exists():
            break
        time.sleep(0.1)
    assert not copy.exists(), "the staged copy outlived the harness"
    assert not Path(f"/proc/{ranks}").exists() or "Z" in Path(f"/proc/{ranks}/stat").read_text().split()[2]


def test_rh_strace_without_strace_is_one_line_before_anything(tmp_path, monkeypatch):
    """RH_STRACE=1 where strace is not installed: preflight refuses, naming the package."""
    from types import SimpleNamespace

    from restart_harness import preflight
    from restart_harness.errors import UsageError

    spec = SimpleNamespace(spec=SimpleNamespace(env_stage=None, dry_run=False))  # what preflight.stage reads of a run
    monkeypatch.setenv(strace.ENV, "1")
    monkeypatch.setenv("PATH", str(tmp_path))  # no strace on it
    with pytest.raises(UsageError, match="RH_STRACE=1 needs strace, which is not installed"):
        preflight.stage(spec)
    monkeypatch.delenv(strace.ENV)
    preflight.stage(spec)  # without it, nothing to check
