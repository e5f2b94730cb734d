"""benchmarks/compare_engines.py's input and its ceiling (issue 67): bad input (its and every benchmark's) is one line
and exit 2 with nothing created; a fio that cannot do direct I/O is said and the built-in probe takes over; an efficiency above 1.0 is never a
plain figure; fio reads the files a restart read (benchmarks/common.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from benchmarks import compare_engines


def bench(args: list[str], tmp: Path, module: str = "compare_engines") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp)})


@pytest.mark.parametrize("args, named", [
    (["0", "tiny"], "REPEATS 0"),
    (["1", "tiny", "only=default,decoupled"], "decoupled cannot run here"),
    (["1", "tiny", "only=default,nosuch"], "unknown case(s) nosuch"),
    (["1", "tiny", "targets=fs,nfs"], "targets=fs,nfs"),
    (["1", "nosuchmodel"], "unknown model 'nosuchmodel'"),  # every case's spec: refused before any case
    (["1", "tiny", "iters=zz"], "iters=zz"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_created(args, named, tmp_path):
    proc = bench(args, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert named in lines[0], lines
    if "decoupled" in named:  # why, and which engines can
        assert "device=cpu" in lines[0] and "engines that can: none, default" in lines[0] and "lazy" in lines[0]
    assert list(tmp_path.iterdir()) == [] and proc.stdout == ""


@pytest.mark.parametrize("module, args, named", [
    ("anatomy", ["1", "iters=x"], "iters=x: not an integer"),
    ("reshard", ["2", "nosuchmodel"], "unknown model 'nosuchmodel'"),
    ("restart_io", ["1", "launcher=local", "nosuch=1"], "unknown key 'nosuch'"),
    ("spine_cold_warm", ["0"], "REPEATS 0"),
    ("crossover", ["1", "extra"], "extra: accepted: [REPEATS] [out=...] [reuse=...]"),
    ("emulation", ["bogus"], "bogus: accepted: [compare [REPEATS]]"),
    ("fastpersist_writer", ["x"], "x: accepted: [REPEATS] [SIZE_MIB]"),
    ("load_figures", ["1", "nosuchmodel"], "unknown model 'nosuchmodel'"),
])
def test_every_benchmarks_bad_input_is_one_line_and_exit_2(module, args, named, tmp_path):
    """benchmarks.common.words: the other benchmarks' command lines, refused before they make a scratch folder."""
    proc = bench(args, tmp_path, module)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and named in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == [] and proc.stdout == ""


def test_a_fio_without_direct_io_is_said_and_the_builtin_probe_takes_over(tmp_path, monkeypatch, capsys):
    """fio installed but refusing O_DIRECT on the target (stood in by a fio that fails as fio does there): one line
    says so, the ceiling comes from the built-in probe and says that; with no fio at all, the same, said so."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "fio").write_text("#!/bin/sh\necho 'fio: looks like your file system does not support direct=1' >&2\n"
                              "exit 1\n")
    (fake / "fio").chmod(0o755)
    where = tmp_path / "disk"
    where.mkdir()
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    tool, how = compare_engines.ceiling_tool(where)
    said = capsys.readouterr().err.strip().splitlines()
    assert tool == "builtin" and "BUILT-IN PROBE" in how and "does not support direct=1" in how
    assert len(said) == 1 and said[0].startswith(f"fio cannot do direct I/O in {where}"), said
    assert list(where.iterdir()) == []
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert compare_engines.ceiling_tool(where) == ("builtin", "the BUILT-IN PROBE (fio is not installed)")


def test_an_efficiency_above_one_says_why_or_flags_the_ceiling():
    assert compare_engines.efficiency([0.8, 0.9, 0.95], None) == "0.90 (0.80-0.95)"
    shared = compare_engines.efficiency([0.9, 1.2, 1.1], "shared memory")
    assert shared.startswith("1.10 (0.90-1.20)") and "above 1: shared memory" in shared
    assert "CEILING NOT MEASURED RIGHT" in compare_engines.efficiency([1.05], None)
    row = {"shared": [False], "read_io": ["direct"], "x_write": [1.08], "durable_mib_s": [2697],
           "x_storage_read": [1.2], "storage_read_mib_s": [1200], "ceiling_fastest": [{"write": 2600, "read": 1100}]}
    assert compare_engines._why_above(row, "x_write") is None  # nothing lifts a durable write over the disk
    row["ceiling_fastest"] = [{"write": 2800, "read": 1100}]  # but the disk's own fastest run in that repeat did
    assert "fastest write reached 2,800 MiB/s" in compare_engines._why_above(row, "x_write")
    assert compare_engines._why_above(row, "x_storage_read") is None  # nor an O_DIRECT reader's storage read
    assert "read-ahead" in compare_engines._why_above({"shared": [False], "read_io": [None]}, "x_storage_read")
    assert "shared memory" in compare_engines._why_above({"shared": [True], "read_io": ["direct"]}, "x_load")


def test_each_engine_is_also_set_against_fios_best_shape_alone(capsys):
    """The issue's ceiling is fio's best shape; the table's is the faster of it and the built-in probe, so each
    engine's ratio to fio's best alone is printed beside the probes, per repeat against that repeat's best."""
    grid = [{"request_bytes": 16 << 20, "queue_depth": 32, "jobs_per_rank": 2, "write_mib_s": w, "read_mib_s": r}
            for w, r in ((1000.0, 500.0), (2000.0, 800.0))]
    summary = {"checkpoint": {"saves": [{"bytes": 1000 << 20, "durable_seconds": 0.5, "blocking_seconds": 0.1}]},
               "restart": {"load_throughput_mib_s": 1200.0}}
    ceiling = {"write_mib_s": 2500.0, "read_mib_s": 2000.0, "direct": {"grid": grid, "write_mib_s": 2500.0,
                                                                       "read_mib_s": 2000.0}}
    row = compare_engines._row([summary], [ceiling], [None])
    assert row["x_fio_write"] == [1.0] and row["x_fio_read"] == [1.5] and row["x_write"] == [0.8]
    compare_engines._grid_table([ceiling], {"lazy": row, "none": row})
    out = capsys.readouterr().out
    assert "| fio libaio 16 MiB x 32 in flight x 2 job(s) a rank | 2,000 | 800 |" in out
    assert "Against fio's best shape alone" in out and "lazy durable 1.00, load 1.50." in out and "none dur" not in out


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_reads_what_each_rank_read_at_restart_cold_once(tmp_path):
    """The reference of benchmarks/restart_reads.py and compare_engines.py: the files of 1 MiB or more each rank read in the restart (its
    header left out), a chain of fio jobs a rank, one a file, in both shapes: every whole request of each file read
    once (fio leaves out a tail short of a request: 4 MiB of c.bin at 16 MiB requests)."""
    from benchmarks import common

    root = tmp_path / "run" / "checkpoint"
    (root / "t").mkdir(parents=True)
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"checkpoint": {"root": str(root)}}))
    sizes = {"a.bin": 8 << 20, "b.bin": 4 << 20, "c.bin": 20 << 20, "h.json": 100}
    for name, n in sizes.items():
        (root / "t" / name).write_bytes(os.urandom(n))
    ranks = {"a.bin": 0, "h.json": 0, "c.bin": 0, "b.bin": 1}
    latest = {"load_breakdown": {"files": [{"path": f"t/{n}", "rank": r, "read_bytes": sizes[n]}
                                           for n, r in ranks.items()]}}
    files = common.read_files(tmp_path / "run", latest)
    assert files == {0: [root / "t" / "a.bin", root / "t" / "c.bin"], 1: [root / "t" / "b.bin"]}
    for shape, expected in zip(common.FIO.values(), (32 << 20, 28 << 20), strict=True):
        for hold in (0, 64 << 20):  # each job holding memory locked as a rank would (fio's lockmem)
            done, seconds, whole = common.fio_read(files, shape, hold)
            assert done == expected and whole == 32 << 20 and seconds > 0, (shape, hold, done, whole, seconds)
