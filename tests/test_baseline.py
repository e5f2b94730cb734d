"""Storage baseline: both tools really write, fsync and read files in a temporary folder, the result is cached
atomically, the probe cleans up after itself, and bad input is one line with exit code 2."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, require_tool

from restart_harness.files import baseline
from restart_harness.targets.filesystem import FileSystemTarget


def baseline_cli(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RH_CACHE_DIR": str(cache)}
    return subprocess.run([str(REPO / "submit-job.sh"), "baseline", *args], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=300, env=env)


def test_baselines_are_this_checkouts_own_unless_shared_is_asked_for(tmp_path, monkeypatch):
    """Issue 68: a prediction in one checkout used a baseline measured in another's folder (one user cache). By
    default each checkout has its own folder of baselines; RH_BASELINE_CACHE=shared shares one, and says so."""
    monkeypatch.setenv("RH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(baseline.SCOPE_ENV, raising=False)
    own = baseline.cache_root()
    assert own.parent == tmp_path / "baseline" and own.name.startswith("checkout-")
    assert baseline.scope_words() == "this checkout's own"
    monkeypatch.setenv(baseline.SCOPE_ENV, "shared")
    assert baseline.cache_root() == tmp_path / "baseline"
    assert "shared by every checkout" in baseline.scope_words() and baseline.scope_problem() is None
    monkeypatch.setenv(baseline.SCOPE_ENV, "everyone")
    assert baseline.scope_problem() == "RH_BASELINE_CACHE=everyone: accepted: checkout, shared"


@pytest.mark.parametrize("tool", ["fio", "builtin"])
def test_baseline_measures_and_caches(tool, tmp_path, monkeypatch):
    if tool == "fio":
        require_tool("fio", package="fio")
    target, cache = tmp_path / "disk", tmp_path / "cache"
    target.mkdir()
    proc = baseline_cli([f"dir={target}", f"tool={tool}", "file_bytes=4M", "ranks=2"], cache, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "write_mib_s" in proc.stdout and "read_mib_s" in proc.stdout
    entries = list(cache.rglob("*.json"))
    assert len(entries) == 1 and entries[0].name == f"{4 << 20}x2.json"
    record = json.loads(entries[0].read_text())
    assert record["tool"] == tool and record["method"].startswith("fio" if tool == "fio" else "builtin")
    assert record["file_bytes"] == 4 << 20 and record["ranks"] == 2 and record["dir"] == str(target.resolve())
    assert record["write"]["bytes"] == record["read"]["bytes"] == 8 << 20
    assert record["write_mib_s"] > 0 and record["read_mib_s"] > 0
    assert record["read_cache"]["observed"]  # what mincore saw before the read, whatever it was
    # the metadata probe (mdtest's shape): 2 ranks x 500 files created, stat-ed, opened and removed
    meta = record["metadata"]
    assert (meta["ranks"], meta["files_per_rank"]) == (2, 500), meta
    assert all(meta[f"{step}_per_s"] > 100 for step in ("create", "stat", "open", "remove")), meta
    assert "metadata      create" in proc.stdout
    # the ceiling: the same files with O_DIRECT, engine=lazy's requests (capped at the file) and queue depth
    ceiling = record["ceiling"]
    direct = ceiling["direct"]
    assert (direct["o_direct"], direct["refused"], direct["request_bytes"], direct["queue_depth"]) == (
        True, None, 4 << 20, baseline.CEILING_QUEUE_DEPTH), direct
    assert direct["write"]["bytes"] == direct["read"]["bytes"] == 8 << 20 and direct["spread"]["repeats"] == 3
    # per direction the best of the probes (a tie to the earlier): with tool=fio first fio's grid (issue 67); for
    # reads, the probe's files read buffered too
    grid = direct.get("grid") or []
    assert len(grid) == (5 if tool == "fio" else 0), direct
    candidates = {"write": [*(("fio", g["write_mib_s"]) for g in grid), ("direct", direct["write_mib_s"]),
                            ("baseline", record["write_mib_s"])],
                  "read": [*(("fio", g["read_mib_s"]) for g in grid), ("direct", direct["read_mib_s"]),
                           ("buffered", direct["buffered_read_mib_s"]), ("baseline", record["read_mib_s"])]}
    for way, known in candidates.items():
        best = max(known, key=lambda c: c[1])
        assert (ceiling[f"{way}_from"], ceiling[f"{way}_mib_s"]) == best, (way, known, ceiling)
    assert "ceiling_write_mib_s" in proc.stdout and "ceiling_read_mib_s" in proc.stdout
    assert list(target.iterdir()) == []  # the probe's files are gone
    monkeypatch.setenv("RH_CACHE_DIR", str(cache))
    assert baseline.cached(FileSystemTarget(str(target)).storage_probe(), 4 << 20, 2)["measured_at"] == record["measured_at"]


def test_automatic_probe_is_bounded_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("RH_CACHE_DIR", str(tmp_path / "cache"))
    # A 70B-sized typical file and 64 ranks are probed at most 8 ranks x 16 MiB: seconds, not minutes.
    assert baseline.auto_size(300 << 30, 64, 1 << 40) == (16 << 20, 8)
    assert baseline.auto_size(50_000, 2, 1 << 40) == (16 << 20, 2)
    assert baseline.auto_size(50_000, 2, 5 << 20) is None  # a nearly full file system is not probed
    # a large checkpoint's probe writes a sixteenth of it, at most 2 GiB and 10% of the free space: 3B tp4's 43.8 GB
    assert baseline.auto_size(10_957_494_574, 4, 1 << 40, 43_829_978_296) == (512 << 20, 4)
    assert baseline.auto_size(10_957_494_574, 4, 1 << 40, 4 << 30) == (64 << 20, 4)
    assert baseline.auto_size(10_957_494_574, 4, 4 << 30, 43_829_978_296) == (107_372_544, 4)  # 10% of 4 GiB / 4
    first = baseline.for_run(FileSystemTarget(str(tmp_path / "ckpt")).storage_probe(), 50_000, 2)
    again = baseline.for_run(FileSystemTarget(str(tmp_path / "ckpt")).storage_probe(), 50_000, 2)
    assert first["cached"] is False and again["cached"] is True
    assert again["write_mib_s"] == first["write_mib_s"] and again["measured_at"] == first["measured_at"]
    assert again["ceiling"] == first["ceiling"] and first["ceiling"]["write_mib_s"] > 0
    # an entry an older probe cached (before the ceiling existed, or before it read buffered too: what
    # engine=lazy's read_io=auto decides by) is measured again, not used without those figures
    path = next((tmp_path / "cache").rglob("*.json"))
    for drop in ("ceiling", "buffered_read_mib_s"):
        old = json.loads(path.read_text())
        assert old["record_version"] == baseline.RECORD_VERSION and "buffered_read_mib_s" in old["ceiling"]["direct"]
        del old["record_version"]
        if drop == "ceiling":
            del old["ceiling"]
        else:
            del old["ceiling"]["direct"]["buffered_read_mib_s"]
        path.write_text(json.dumps(old))
        assert baseline.for_run(FileSystemTarget(str(tmp_path / "ckpt")).storage_probe(), 50_000, 2)["cached"] is False


def test_the_ceiling_is_the_better_probe_per_direction_with_its_spread():
    def probe(write, read):
        return {"write": {"mib_s": write}, "read": {"mib_s": read}, "method": "m", "request_bytes": 1,
                "queue_depth": 4, "o_direct": True, "refused": None}

    record = {"write_mib_s": 300.0, "read_mib_s": 1500.0,
              "spread": {"repeats": 3, "write_mib_s": [250.0, 350.0], "read_mib_s": [1400.0, 1600.0]}}
    c = baseline.ceiling(record, [probe(900.0, 1000.0), probe(1200.0, 1100.0), probe(1000.0, 900.0)])
    assert (c["write_mib_s"], c["write_from"], c["spread"]["write_mib_s"]) == (1000.0, "direct", [900.0, 1200.0])
    # buffered reads beat the direct probe here: the baseline is the ceiling, with the baseline's spread
    assert (c["read_mib_s"], c["read_from"], c["spread"]["read_mib_s"]) == (1500.0, "baseline", [1400.0, 1600.0])
    assert c["direct"]["read_mib_s"] == 1000.0 and c["spread"]["repeats"] == 3
    assert baseline.ceiling(record, []) is None  # object storage: no ceiling, no number
    # the probe's shape read through the page cache, faster than both: the read ceiling, said to be buffered
    buffered = [{**probe(900.0, 1000.0), "read_buffered": {"mib_s": m}} for m in (1700.0, 1650.0, 1800.0)]
    c = baseline.ceiling(record, buffered)
    assert (c["read_mib_s"], c["read_from"], c["spread"]["read_mib_s"]) == (1700.0, "buffered", [1650.0, 1800.0])
    assert c["write_from"] == "direct" and c["direct"]["buffered_read_mib_s"] == 1700.0


def test_the_ceiling_probe_reads_the_same_files_buffered_too(tmp_path):
    """The file system's ceiling probe reads its files a second time, evicted, in the same shape through the page
    cache; the built-in probe is the default (the engine's own threads), fio only when asked for."""
    probe = FileSystemTarget(str(tmp_path / "ckpt")).storage_probe()
    out = probe.measure_ceiling(8 << 20, 2, "auto")
    assert out["tool"] == "builtin" and out["read"]["bytes"] == 2 * (8 << 20)
    assert out["read_buffered"]["bytes"] == 2 * (8 << 20) and out["read_buffered"]["mib_s"] > 0
    assert "buffered" in out["read_buffered_means"] and not list((tmp_path / "ckpt").rglob("rh.*"))


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps (not Linux)")
def test_the_ceiling_probes_buffers_are_private_and_in_huge_pages_where_the_kernel_gives_them():
    """The direct probe's reused buffers are a private mapping asking for transparent huge pages, and get them where
    the kernel offers them to such mappings: an anonymous shared mapping is shmem, which THP leaves out by default,
    and its scattered 4 KiB pages cut each O_DIRECT request to about 1 MiB on a virtio disk (a ceiling measured at
    half the disk's pace, below what engine=lazy's staging reached; docs/measurements.md)."""
    from restart_harness.targets import _fs_probe

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    offered = thp.is_file() and "[never]" not in thp.read_text()
    with _fs_probe._aligned_buffer(8 << 20) as view:
        view[:] = bytes(len(view))  # touched, as the probe's first request does
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        mapping = _mapping(address)
    assert "sh" not in mapping["VmFlags"] and "hg" in mapping["VmFlags"], mapping
    if offered:
        assert int(mapping["AnonHugePages"]) >= 2048, mapping  # kB: one 2 MiB page at least


def _mapping(address: int) -> dict[str, str]:
    """/proc/self/smaps's fields of the mapping that holds address (VmFlags as one string)."""
    fields: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head, *rest = line.split()
        if "-" in head and ":" not in head:
            if fields is not None:
                break
            lo, hi = (int(x, 16) for x in head.split("-"))
            fields = {} if lo <= address < hi else None
        elif fields is not None:
            fields[head.rstrip(":")] = " ".join(rest[:1] if head != "VmFlags:" else rest)
    assert fields is not None, f"no mapping holds {address:#x}"
    return fields


def test_fio_measures_the_ceiling_over_its_grid_and_the_best_shape_is_the_ceiling(tmp_path):
    """Issue 67: with tool=fio the ceiling probe runs fio's grid (O_DIRECT, libaio, each shape's write fsync'd at
    the end and read back cold) beside the engine's own shape; the ceiling is the best median of them all, and
    says it came from fio where a grid shape was best."""
    require_tool("fio", package="fio")
    from restart_harness.targets import _fs_probe

    probe = FileSystemTarget(str(tmp_path / "ckpt")).storage_probe()
    out = probe.measure_ceiling(8 << 20, 2, "fio")
    grid = out["grid"]
    assert out["grid_refused"] is None and len(grid) == len(_fs_probe.FIO_GRID), out
    assert [(g["request_bytes"], g["queue_depth"], g["jobs_per_rank"]) for g in grid] == list(_fs_probe.FIO_GRID)
    assert all(g["write_mib_s"] > 0 and g["read_mib_s"] > 0 and g["read_cache"] == "cold" for g in grid), grid
    assert out["read_buffered"]["mib_s"] > 0 and not list(tmp_path.rglob("rh.*"))
    record = {"write_mib_s": 1.0, "read_mib_s": 1.0, "spread": {"repeats": 1, "write_mib_s": [1.0, 1.0],
                                                                "read_mib_s": [1.0, 1.0]}}
    c = baseline.ceiling(record, [out, out, out])
    best = max([(g["write_mib_s"], "fio") for g in grid] + [(out["write"]["mib_s"], "direct")], key=lambda x: x[0])
    assert (c["write_mib_s"], c["write_from"]) == best and c["direct"]["grid"][0]["write_spread"][0] > 0
    assert "ceiling_fio" in "\n".join(baseline._ceiling_lines(c))


def test_a_fio_that_cannot_do_direct_io_leaves_the_grid_out_and_says_why(tmp_path, monkeypatch):
    """A file system that refuses O_DIRECT (stood in by a fio that fails every job as fio does there): no grid, the
    reason recorded, the engine's own probe still measured."""
    from restart_harness.targets import _fs_probe

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "fio").write_text("#!/bin/sh\necho 'fio: looks like your file system does not support direct=1' >&2\n"
                              "exit 1\n")
    (fake / "fio").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    grid, why = _fs_probe.fio_grid(tmp_path, 8 << 20, 2)
    assert grid is None and "cannot do direct I/O" in why and "does not support direct=1" in why, why
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert _fs_probe.fio_grid(tmp_path, 8 << 20, 2) == (None, "fio is not installed")


@pytest.mark.parametrize("args, named", [
    ([], "dir="),
    (["dir=/nonexistent/rh-disk"], "/nonexistent/rh-disk"),
    (["dir={tmp}", "tool=dd"], "tool=dd"),
])
def test_baseline_bad_input(args, named, tmp_path):
    args = [a.format(tmp=tmp_path) for a in args]
    before = set(tmp_path.iterdir())
    proc = baseline_cli(args, tmp_path / "cache", tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr
    assert set(tmp_path.iterdir()) == before  # no cache, no probe folder


@pytest.mark.parametrize("token, named", [("file_bytes=0", "file_bytes=0"), ("file_bytes=lots", "file_bytes=lots"),
                                          ("ranks=0", "ranks=0"), ("colour=blue", "colour=blue")])
def test_baseline_bad_values(token, named, tmp_path):
    proc = baseline_cli([f"dir={tmp_path}", token], tmp_path / "cache", tmp_path)
    assert proc.returncode == 2 and named in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "cache").exists()
