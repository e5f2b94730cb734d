"""Inside the restart and the save: the load and save anatomy add up to what was measured, on every rank; a traced
run's per-phase I/O matches the files' sizes; memory per phase; a verification that detects any changed byte; the
timeline figure shows every rank. Real runs from the run table (conftest.RUNS)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import REPO, cases, copy_run, events, load_summary

from restart_harness import iocount
from restart_harness.model import digest
from restart_harness.schema import SAVE_CATEGORIES

ANATOMY_RUNS = cases("tiny-dp2", "tp2-pp2-dp2", "torchsnapshot-dp2", "dcp-tp2-pp2", "fastpersist-dp2")
WITHIN = 0.05  # the bound: categories add up to the measured figure within 5%
# DeepSpeed's torch.save / torch.load read and write on the rank's main thread alone; torchsnapshot and DCP may not,
# and FastPersist's double buffers keep two libaio writes in flight
SINGLE_READER = {"tiny-dp2": True, "tp2-pp2-dp2": True, "torchsnapshot-dp2": False, "dcp-tp2-pp2": False,
                 "fastpersist-dp2": False}


# ---- the load -----------------------------------------------------------------------------------------------
# The categories partition the anatomy's own window (`other` is its remainder) and the checkpoint_load phase is
# that window: checking one against the other would hold by construction. These are checked against what others
# measured: the rank's own bracket around the load (outside the anatomy code), the recorder's timer around each
# engine load, and the I/O counters' per-file seconds.
@pytest.mark.slow
@pytest.mark.parametrize("name", ANATOMY_RUNS)
def test_load_window_is_the_load_and_its_categories_are_what_others_measured(harness, name):
    run_dir = harness.run(name)
    lb = load_summary(run_dir)["restart"]["load_breakdown"]
    assert lb["method"] == "preloaded I/O counters"
    for rank, evs in events(run_dir, "restart-01").items():
        loaded = next(e for e in evs if e["event"] == "loaded")
        window = next(e for e in evs if e["event"] == "load_anatomy")
        # the window (hence the checkpoint_load phase) lies inside the bracket the manager took around the load
        assert loaded["outer_start"] <= window["start"] <= window["end"] <= loaded["outer_end"], rank
        row = next(r for r in lb["per_rank"] if r["rank"] == rank)
        # read and deserialize happen inside the engine's loads (the recorder's clock around each, which also holds the
        # anatomy's own bookkeeping), and the loads inside the window
        engine_loads = sum(f["seconds"] for f in loaded["files"])
        assert 0 < row["read_seconds"] + row["deserialize_seconds"] <= engine_loads + 1e-5
        assert engine_loads <= window["window_seconds"] + window["excluded_seconds"].get("verify", 0) + 1e-5
        # read seconds are wall time with a read in flight inside the engine's loads: at most the counters' seconds
        # inside reads of the files the engine loaded (their sum over calls), and those exactly where one thread reads
        # (DeepSpeed's torch.load). `latest` is read before the engine's loads (`other`: 2 ms once on a crowded node)
        counted = sum(f["read_seconds"] for f in lb["files"] if f["rank"] == rank and f["path"] != "latest")
        assert row["read_seconds"] <= counted + 1e-5, rank  # figures are rounded to 1e-6 s
        if SINGLE_READER[name]:
            assert row["read_seconds"] == pytest.approx(counted, rel=WITHIN, abs=2e-3), rank
        assert row["read_seconds"] > 0 and row["read_bytes"] > 0


@pytest.mark.slow
def test_load_reads_every_byte_of_the_files_each_rank_loaded(harness):
    """The counters see each rank read at least every byte of each file its load_checkpoint opened."""
    run_dir = harness.run("tp2-pp2-dp2")
    lb = load_summary(run_dir)["restart"]["load_breakdown"]
    tag_dir = Path(load_summary(run_dir)["checkpoint"]["dir"])
    by_rank: dict[int, dict[str, int]] = {}
    for f in lb["files"]:
        by_rank.setdefault(f["rank"], {})[f["path"]] = f["read_bytes"]
    for rank, evs in events(run_dir, "restart-01").items():
        loaded = next(e for e in evs if e["event"] == "loaded")
        for path in {Path(f["path"]).name for f in loaded["files"]}:
            size = (tag_dir / path).stat().st_size
            got = by_rank[rank][f"{tag_dir.name}/{path}"]
            assert got >= size, (rank, path, got, size)
            assert got <= 2 * size + 64 * 1024, (rank, path)  # at most twice (DeepSpeed's mp-size check) + headers
        assert sum(by_rank[rank].values()) == next(r["read_bytes"] for r in lb["per_rank"] if r["rank"] == rank)


# ---- the save -----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ANATOMY_RUNS)
def test_save_window_is_the_save_and_counts_every_byte_written(harness, name):
    """The window shares the save's clock (from its start to the commit): its categories add up to commit_seconds
    (no region counted twice, none outside the save), and they agree with the counters' bytes and per-file seconds."""
    run_dir = harness.run(name)
    for rank, evs in events(run_dir).items():
        for save in (e for e in evs if e["event"] == "save"):
            a = save["anatomy"]
            # to the rounding of five figures to 1e-6 s (once 2 ms apart: the memory probe sat between two clocks)
            assert sum(a["seconds"][c] for c in SAVE_CATEGORIES) == pytest.approx(save["commit_seconds"], abs=1e-5)
            assert a["window_seconds"] == pytest.approx(save["commit_seconds"], abs=1e-6)
            assert a["io"]["write"]["bytes"] >= save["bytes"]  # rank 0 also writes `latest`
            assert a["io"]["write"]["bytes"] <= save["bytes"] + 64
            assert a["io"]["sync"]["calls"] >= len(save["files"])
            # write seconds: at most the counters' seconds inside writes, and those of the tag's files where one thread
            # writes. Rank 0's write of `latest` (at the commit, outside the engine's save: `other`) is counted but is
            # not the save's: the likely cause of one failure, 0.5 ms attributed against 5.7 ms counted (2026-11-27)
            counted = sum(f["write"]["seconds"] for f in a["files"].values())
            assert a["seconds"]["write"] <= counted + 1e-5, (rank, save["tag"])
            if SINGLE_READER[name]:
                saved = sum(f["write"]["seconds"] for p, f in a["files"].items() if f"/{save['tag']}/" in p)
                assert a["seconds"]["write"] == pytest.approx(saved, rel=WITHIN, abs=2e-3), (rank, save["tag"])


@pytest.mark.slow
def test_async_save_breakdown_covers_the_blocking_part_and_the_flush(harness):
    run_dir = harness.run("dcp-async-dp2")
    for save in load_summary(run_dir)["checkpoint"]["saves"]:
        assert save["breakdown"]["flush"]["seconds_max"] > 0
    for rank, evs in events(run_dir).items():
        for save in (e for e in evs if e["event"] == "save"):
            # every byte a rank wrote is counted in its save's window or in its flush (counted from its return)
            counted = save["anatomy"]["io"]["write"]["bytes"] + save["flush"]["io"]["write"]["bytes"]
            assert counted >= save["bytes"], (rank, save["tag"])
            # the files are made durable by the flush, after the save returned: the harness's fsync of every file
            # is in the flush. (DCP's own writer thread starts inside the blocking part, so a sync of its may be
            # in flight before the save returns: the window's fsync seconds are not asserted to be zero.)
            assert save["flush"]["io"]["sync"]["calls"] >= len(save["files"]), (rank, save["tag"])


def test_a_window_on_a_callers_clock_partitions_exactly_its_span():
    """A save's window takes the manager's start and end stamps (worker/manager.py): its categories, `other` the
    remainder, add up to that span, and a region's time is its own less the regions nested in it, even when the
    window started before it was opened and closed after its end stamp was taken. (Relations between clocks only:
    no figure is bounded by a number, which a busy machine would break.)"""
    import time

    from restart_harness.worker.anatomy import Anatomy

    clock = time.perf_counter
    anatomy = Anatomy()
    start = (time.time(), clock())
    time.sleep(0.02)  # between the caller's start and the window's opening: the window's, as `other`
    before_open = clock()
    with anatomy.measure(SAVE_CATEGORIES, start=start) as window:
        with anatomy.region("serialize"):
            s0 = clock()
            time.sleep(0.02)
            s1 = clock()
            with anatomy.region("wait"):
                w0 = clock()
                time.sleep(0.03)
                w1 = clock()
        end = clock()
        time.sleep(0.05)  # after the caller's end stamp: in no category
        record = window.close(end=end)
    span, got = end - start[1], record["seconds"]
    assert record["window_seconds"] == pytest.approx(span, abs=1e-6) and record["start"] == start[0]
    # (in this process no counter library is preloaded: write and fsync cannot be told apart and are None)
    assert sum(v for v in got.values() if v is not None) == pytest.approx(span, abs=5e-6)
    # (+ 1e-6: the figures are rounded to the microsecond)
    assert w1 - w0 <= got["wait"] + 1e-6 and got["wait"] <= end - s0  # holds its sleep, lies inside the window
    assert s1 - s0 <= got["serialize"] + 1e-6  # its own time: its sleep ...
    assert got["serialize"] + got["wait"] <= end - before_open + 2e-6  # ... and not the wait nested in it twice
    assert got["other"] + 1e-6 >= before_open - start[1]  # from the caller's start to the window's opening


# ---- memory -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_without_anatomy_the_load_phase_still_holds_the_load(harness):
    """anatomy=false opens no window: the checkpoint_load phase is still the load (once measured as 0 s, the load
    counted into engine_init)."""
    run_dir = harness.run("pp2-dp2")  # anatomy=false
    restart = load_summary(run_dir)["restart"]
    assert restart["verified"] is True and restart.get("load_breakdown") is None
    assert restart["phases"]["checkpoint_load"] >= restart["load_seconds"] > 0


@pytest.mark.slow
def test_memory_high_water_mark_per_phase(harness):
    summary = load_summary(harness.run("tiny-dp2"))
    restart_memory = summary["restart"]["memory"]
    assert list(restart_memory) == ["imports", "dist_init", "model_build", "engine_init", "checkpoint_load",
                                    "first_step", "training"]
    for phase, m in restart_memory.items():
        assert 50 << 20 < m["peak_rss_bytes_max"] < 4 << 30, phase
        assert m["peak_rss_bytes_median"] <= m["peak_rss_bytes_max"]
    # phases are measured apart: importing torch peaks lower than deepspeed.initialize does
    assert restart_memory["imports"]["peak_rss_bytes_max"] < restart_memory["engine_init"]["peak_rss_bytes_max"]
    assert list(summary["training"]["memory"]) == ["imports", "dist_init", "model_build", "engine_init", "training"]


# ---- the trace --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_traced_run_shows_every_byte_written_and_read_per_phase(harness):
    run_dir = harness.run("tp2-dp2")  # trace=true
    summary = load_summary(run_dir)
    ckpt_trace = summary["checkpoint"]["trace"]
    assert ckpt_trace["tool"] == "dftracer" and ckpt_trace["events"] > 0
    assert list((run_dir / "traces" / "checkpoint").glob("*.pfw.gz"))  # the raw traces stay
    for save in summary["checkpoint"]["saves"]:
        phase = ckpt_trace["phases"][f"save {save['tag']}"]
        written = sum(s["bytes"] for s in save["per_rank"]) + len(save["tag"])  # + the `latest` file
        assert phase["write_bytes"] == written, save["tag"]
        assert phase["operations"]["fsync"] >= save["files"] and phase["files_opened"] >= save["files"]
        assert phase["metadata_operations"] > 0 and phase["io_seconds"] > 0
    restart = summary["restart"]
    load_phase = restart["trace"]["phases"]["checkpoint_load"]
    counted = sum(r["read_bytes"] for r in restart["load_breakdown"]["per_rank"])
    assert load_phase["read_bytes"] == counted  # the tracer and the counters saw the same reads
    assert sum(load_phase["request_sizes"]["read"].values()) == sum(
        v for k, v in load_phase["operations"].items() if k in ("read", "pread64", "readv", "preadv"))
    assert restart["trace"]["outside_phases"]["write_bytes"] == 0


DFTRACER_ALONE = r"""
import os, sys, torch
torch.save({"w": torch.ones(1 << 18)}, sys.argv[1])
"""


def test_dftracer_alone_misses_torch_save_writes(tmp_path):
    """third_party/dftracer_compat.py is needed while this holds: dftracer 2.2.0 by itself records no write of a
    torch.save (libstdc++ opens with fopen64, writes with writev on a descriptor dftracer never saw opened)."""
    from restart_harness.results.trace import read_events
    from third_party.dftracer_compat import preload_library

    lib = preload_library()
    if lib is None:
        pytest.skip("dftracer not installed (pip install 'restart-harness[trace]')")
    data, traces = tmp_path / "data", tmp_path / "traces"
    data.mkdir()
    traces.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(lib), "DFTRACER_ENABLE": "1", "DFTRACER_INIT": "PRELOAD",
           "DFTRACER_DATA_DIR": str(data), "DFTRACER_LOG_FILE": str(traces / "t"), "DFTRACER_INC_METADATA": "1"}
    subprocess.run([sys.executable, "-c", DFTRACER_ALONE, str(data / "x.pt")], env=env, check=True, timeout=120)
    names = {e["name"] for e in read_events(traces)}
    assert "fopen64" in names  # it saw the file opened
    assert not names & {"write", "writev", "fwrite"}, "dftracer now sees torch.save's writes: drop the shim"


# ---- verification --------------------------------------------------------------------------------------------
def test_digest_detects_every_single_byte_change():
    generator = torch.Generator().manual_seed(7)
    for dtype, n in ((torch.bfloat16, 5003), (torch.float32, 3000), (torch.int64, 2049), (torch.uint8, 13)):
        t = (torch.randn(n, generator=generator) * 100).to(dtype)
        base = digest.tensor_digest(t)
        raw = t.view(torch.uint8)
        for position in torch.randint(0, raw.numel(), (40,), generator=generator).tolist() + [0, raw.numel() - 1]:
            changed = t.clone()
            changed.view(torch.uint8)[position] ^= 0x01 << (position % 8)
            assert digest.tensor_digest(changed) != base, (dtype, position)


def test_digest_detects_moved_blocks_and_wrong_shape():
    t = torch.randn(4 * digest.BLOCK_WORDS * 2)  # 4 blocks of 8 KiB as fp32
    swapped = torch.cat([t[2 * digest.BLOCK_WORDS:], t[: 2 * digest.BLOCK_WORDS]])
    assert digest.tensor_digest(swapped) != digest.tensor_digest(t)
    assert digest.tensor_digest(t.view(2, -1)) != digest.tensor_digest(t)
    assert digest.tensor_digest(t.clone()) == digest.tensor_digest(t)


@pytest.mark.slow
def test_a_flipped_byte_in_a_checkpoint_file_fails_the_restart_naming_the_tensor(harness, tmp_path):
    """One byte of the fp32 master weights inside an optimizer file of a complete run is flipped on disk (size
    unchanged, so the preflight's size check passes): the restart-only re-run loads it, verification fails naming that
    tensor, the command fails with no "verified" line, and the re-run's record says so (its outcome: failed, the
    tensor). The run itself stays complete: its own restart verified, and the report still shows it."""
    run_dir = copy_run(harness.run("dp2-short"), tmp_path)
    path = run_dir / "checkpoint" / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with zipfile.ZipFile(path) as z:
        entries = [i for i in z.infolist() if "/data/" in i.filename]
        biggest = max(entries, key=lambda i: i.file_size)
    with open(path, "r+b") as f:  # the entry's data starts after its local header (30 bytes + name + extra)
        f.seek(biggest.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        offset = biggest.header_offset + 30 + name_len + extra_len + biggest.file_size // 2
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "restart", f"run={run_dir}"],
                          capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "restart-02: restart did not restore the saved state" in last and "rank 1: optimizer." in last, last
    assert "[restart-02] restored state verified" not in proc.stderr
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] is False and summary["restart"]["outcome"]["state"] == "failed"
    assert "rank 1: optimizer." in summary["restart"]["outcome"]["reason"]
    assert any(d.startswith("rank 1: optimizer.") for d in summary["restart"]["differing"])
    first = next(r for r in summary["restarts"] if r["record"] == "restart-01")
    assert first["verified"] is True and first["outcome"]["state"] == "verified" and not first["rerun"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == summary["status"]["state"] == "complete", status
    # ... and says that a later re-run failed verification (issue 68)
    assert [(r["record"], r["state"]) for r in status["reruns_failed"]] == [("restart-02", "failed")], status
    assert "restart-02: restart did not restore the saved state" in status["reason"], status
    report = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "report", str(run_dir),
                             f"out_dir={tmp_path / 'report'}"], capture_output=True, text=True, timeout=300, cwd=REPO,
                            check=False)
    assert report.returncode == 0, report.stderr
    with open(tmp_path / "report" / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # each restart's row is in its own state: the run's verified restart complete, the re-run failed
    assert [(r["restart_record"], r["state"]) for r in rows] == [("restart-01", "complete"), ("restart-02", "failed")]
    assert "did not restore the saved state" in rows[1]["state_reason"], rows[1]


# ---- the report ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_timeline_figure_shows_every_rank(harness):
    from analysis import load as ld
    from analysis import panels, table

    run_dir = harness.run("tp2-pp2-dp2")
    runs, _ = ld.load([run_dir])
    groups = table.groups(runs)
    fig = panels.restart_timeline(groups, list(table.KNOWN_PHASES))
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"rank {r}" for r in range(8)]
    restart = load_summary(run_dir)["restart"]
    t0 = min(r["marks"]["process_start"] for r in restart["per_rank"])
    bars = [p for p in ax.patches if p.get_height() == 0.5]  # the phase bars (load detail bars are thinner)
    for r in restart["per_rank"]:
        mine = [b for b in bars if abs(b.get_y() + 0.25 - r["rank"]) < 1e-6]
        # launcher + six phases + verification, each drawn between this rank's own marks
        assert len(mine) == 8
        ends = max(b.get_x() + b.get_width() for b in mine)
        assert ends == pytest.approx(r["marks"]["first_step_done"] - t0, abs=1e-6)


def test_counter_library_builds_and_counts(tmp_path):
    """rhio.c compiled here, preloaded into a child that writes, fsyncs and reads one file."""
    lib = iocount.build()
    assert lib is not None and lib.is_file()
    code = ("import os, sys; from restart_harness import iocount; c = iocount.Counters(); p = sys.argv[1]; "
            "f = open(p, 'wb'); f.write(b'x' * 5000); f.flush(); os.fsync(f.fileno()); f.close(); "
            "open(p, 'rb').read(); import json; print(json.dumps(c.totals()))")
    totals = _preloaded(lib, code, tmp_path)
    assert totals["write"]["bytes"] == 5000 and totals["sync"]["calls"] == 1 and totals["read"]["bytes"] == 5000
    assert totals["files"] == 1 and totals["opens"] == 2


def _preloaded(lib: Path, code: str, tmp_path: Path) -> dict:
    """Run `code` (it prints the counters' totals as JSON; sys.argv[1] is a file under tmp_path) with lib preloaded."""
    env = {**os.environ, "LD_PRELOAD": str(lib), iocount.ENV_PREFIXES: str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f")], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return json.loads(out)


def test_counter_library_counts_vector_and_positioned_calls(tmp_path):
    """os.pwritev / os.preadv (engine=lazy's writes and reads) reach libc as pwritev64 / preadv64: counted too."""
    lib = iocount.build()
    code = ("import os, sys, json; from restart_harness import iocount; c = iocount.Counters(); p = sys.argv[1]; "
            "fd = os.open(p, os.O_RDWR | os.O_CREAT); os.pwritev(fd, [b'a' * 3000, b'b' * 1000], 0); "
            "os.pwrite(fd, b'c' * 96, 4000); buf = bytearray(4096); os.preadv(fd, [buf], 0); "
            "os.pread(fd, 10, 0); os.close(fd); print(json.dumps(c.totals()))")
    totals = _preloaded(lib, code, tmp_path)
    assert totals["write"]["bytes"] == 4096 and totals["write"]["calls"] == 2
    assert totals["read"]["bytes"] == 4096 + 10 and totals["read"]["calls"] == 2


def test_a_ranks_digests_read_back_at_once_are_each_tensors_own():
    """digests() queues every tensor's sums and reads them back once (issue 67): each name still gets its own
    tensor's digest, whatever its companions, and a value that is no tensor its repr."""
    state = {"w": torch.randn(3 * digest.BLOCK_WORDS + 5), "m": torch.randn(7, 3).bfloat16(), "step": 12,
             "z": torch.zeros(0), "b": torch.arange(9, dtype=torch.uint8)}
    together = digest.digests(state)
    assert together == {k: digest.digests({k: v})[k] for k, v in reversed(state.items())}
    assert together["step"] == "12" and len(set(together.values())) == len(state)
