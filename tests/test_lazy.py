"""engine=lazy (engines/lazy/, format in engines/lazy/format.py): the format round-trips every kind of tensor a
DeepSpeed state holds; real runs save, restart and verify at dp=2 (the replicated model file split over both
replicas) and tp=2 pp=2 dp=2 (layer files spread over replicas, parts staged in rings of write requests); a ring
writes the files a whole buffer writes, byte for byte; its checkpoint converted to DeepSpeed's layout
equals the default engine's checkpoint of the same run tensor for tensor and is read by DeepSpeed's zero_to_fp32;
a rank killed in the middle of a flush leaves `latest` on the last checkpoint every rank made durable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from conftest import REPO, copy_run, events, load_summary, restart, run_cli

from engines.lazy import Options, buffers
from engines.lazy import format as fmt
from engines.lazy import staging as lazy_writers
from engines.lazy.policy import Decision
from engines.lazy.save import LazyIO


def _engine(**options):
    return LazyIO(Options(**options), None)


def test_format_round_trips_every_kind_of_tensor(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = OrderedDict(
        module=OrderedDict(w=torch.randn(3, 5, dtype=torch.bfloat16), view=base[:, 1:3], row=base[2],
                           scalar=torch.tensor(7, dtype=torch.int64), empty=torch.empty(0, 4),
                           mask=torch.tensor([True, False])),
        optimizer={"state": {0: {"exp_avg": torch.randn(10), "step": torch.tensor(3.0)}}, "lr": 1e-3},
        same=[base, base],  # one tensor referred to twice
        note="text", steps=8,
    )
    engine = _engine(write_chunk_mib=1)
    path = tmp_path / "tag" / "mp_rank_00_model_states.pt"
    written = engine.save(state, str(path))
    engine.wait()
    assert sorted(Path(p).name for p in written) == ["header.json", "part-0.bin", "remainder.pkl"]
    header = json.loads((path / "header.json").read_text())
    assert all(t["offset"] % header["alignment"] == 0 for t in header["tensors"])
    back = engine.load(str(path))
    assert back.keys() == state.keys() and back["note"] == "text" and back["steps"] == 8
    for k, v in state["module"].items():
        assert back["module"][k].dtype == v.dtype and torch.equal(back["module"][k], v), k
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert back["same"][0] is back["same"][1]
    # a torn part is an error naming the file, never a silently short tensor
    part = path / "part-0.bin"
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(OSError, match="part-0.bin"):
        engine.load(str(path))


@pytest.mark.parametrize("nbytes", [4096 * 3, 4096 * 3 + 5, 1, 0])
def test_direct_io_writes_and_reads_the_same_bytes_as_buffered(tmp_path, nbytes):
    """direct_io=true: whole aligned blocks written (the padding cut off again) and read; the files and the state
    read back are the buffered engine's, whatever the part's length."""
    state = {"w": torch.arange(nbytes, dtype=torch.uint8), "b": torch.ones(3, dtype=torch.bfloat16)}
    files = {}
    for direct in (False, True):
        engine = _engine(direct_io=direct, write_chunk_mib=1)
        path = tmp_path / f"direct{direct}" / "tag" / "mp_rank_00_model_states.pt"
        engine.save(state, str(path))
        engine.wait()
        back = engine.load(str(path))
        assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])
        assert "direct_io_fallback" not in engine.statistics()
        files[direct] = {f.name: f.read_bytes() for f in path.iterdir()}
    assert files[True] == files[False]


@pytest.mark.parametrize("direct", [True, False])
def test_a_fresh_buffers_pages_are_populated_ahead_and_the_bytes_are_the_files(tmp_path, direct):
    """A file of several requests read into a fresh buffer: a thread of its own faults in the pages of every request
    no read has begun (MADV_POPULATE_WRITE, Linux 5.14 and later, as here), the reads wait only for a request it is
    at, and the buffer holds the file's bytes exactly, its last partial request included; with populate off, the
    same bytes and no thread."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    size = 3 * buffers.READ_CHUNK_BYTES + 4096 + 7
    data = torch.randint(0, 256, (size,), dtype=torch.uint8)
    path = tmp_path / "part-0.bin"
    path.write_bytes(buffers.byte_view(data).tobytes() + bytes(buffers.aligned(size) - size))
    with ThreadPoolExecutor(1) as pool:
        for populate in (True, False):
            held = threading.Event()
            pool.submit(held.wait, 30)  # the reads start late: the thread gets to every request first
            buf = buffers.aligned_empty(size)
            reads = buffers.Reads(path, buf, pool, direct, populate=populate)
            deadline = time.monotonic() + 30
            while populate and reads.populated < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            held.set()
            reads.wait()
            assert torch.equal(buf, data)
            if populate:
                assert reads.populated == 4 and reads.claims == ["read"] * 4, (reads.populated, reads.claims)
            else:
                assert reads.claims is None and reads.populated == 0
        buf = buffers.aligned_empty(size)  # read_chunk_mib's request size: the same bytes in more requests
        reads = buffers.Reads(path, buf, pool, direct, chunk=1 << 20)
        reads.wait()
        assert torch.equal(buf, data) and reads.requests == -(-size // (1 << 20)) == 49


def _vm_flags(address: int) -> set[str]:
    """The kernel's VmFlags of this process's mapping that holds address (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps (not Linux)")
def test_a_buffer_asked_in_4k_pages_is_not_in_huge_pages_where_a_freed_huge_one_stood():
    """The allocator hands a freed buffer's memory out again with its mapping's flags: a load's buffer in 4 KiB pages
    (policy.load_pages) landed in memory flagged for huge pages about half of the time, and the load's `pages` said
    4k where it was not. Asked for 4 KiB pages, it is flagged against huge pages (`nh`), whatever stood there."""
    size = 3 * buffers.HUGE_PAGE + 4096
    for _ in range(20):
        freed = [buffers.aligned_empty(size, huge_pages=True) for _ in range(3)]
        del freed
        flags = _vm_flags(buffers.aligned_empty(size, huge_pages=False).data_ptr())
        assert "hg" not in flags and "nh" in flags, flags


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps (not Linux)")
@pytest.mark.parametrize("reporting_order", [None, 9])
def test_staging_is_in_huge_pages_and_a_loads_buffers_are_where_the_hypervisor_does_not_take_free_memory_back(
        tmp_path, monkeypatch, reporting_order):
    """A staging buffer, kept and reused save after save, is in transparent huge pages (the mapping flagged `hg`,
    MADV_HUGEPAGE). A load's O_DIRECT buffers are too, unless the kernel hands free 2 MiB blocks back to its
    hypervisor (free page reporting, order 9 here): then each fresh huge page costs the host's fault, and the load
    says so (docs/engines.md#enginelazy)."""
    monkeypatch.setattr("engines.lazy.load.free_page_reporting_order", lambda: reporting_order)
    size = 3 * buffers.HUGE_PAGE + 4096
    part = lazy_writers.Part(tmp_path / "part-0.bin", size, False, [], buffers.READ_CHUNK_BYTES)
    assert "hg" in _vm_flags(part.buffer.data_ptr())
    fmt_dir = tmp_path / "state"
    engine = _engine(read_io="direct")
    state = {"w": torch.randn(size // 4)}
    engine.save(state, str(fmt_dir))
    engine.wait()
    _, _, loaded = engine.loader.read(fmt_dir)
    assert torch.equal(engine.load(str(fmt_dir))["w"], state["w"])
    huge = [b for b in loaded if b.numel() >= buffers.HUGE_PAGE]
    assert huge and all(("hg" in _vm_flags(b.data_ptr())) == (reporting_order is None) for b in huge)
    pages = engine.load_statistics()["pages"]
    assert pages["way"] == ("huge" if reporting_order is None else "4k"), pages
    assert pages.get("free_page_reporting_order") == reporting_order, pages


def test_free_page_reporting_is_read_from_the_balloons_features_and_the_reporting_order(tmp_path, monkeypatch):
    """A virtio balloon whose features have bit 5 (free page reporting) set, with the kernel's reporting order at
    most its largest block, reports; bit 5 clear, an order above 10 (reporting turned off) or no balloon: None."""
    from restart_harness.files import kernel_memory

    balloon, order = tmp_path / "virtio_balloon", tmp_path / "page_reporting_order"
    monkeypatch.setattr(kernel_memory, "BALLOONS", balloon)
    monkeypatch.setattr(kernel_memory, "REPORTING_ORDER", order)
    assert kernel_memory.free_page_reporting_order() is None  # neither file
    (balloon / "virtio0").mkdir(parents=True)
    (balloon / "virtio0" / "features").write_text("0110010" + "0" * 57 + "\n")
    order.write_text("9\n")
    assert kernel_memory.free_page_reporting_order() == 9
    order.write_text("11\n")
    assert kernel_memory.free_page_reporting_order() is None
    order.write_text("9\n")
    (balloon / "virtio0" / "features").write_text("0110000" + "0" * 57 + "\n")
    assert kernel_memory.free_page_reporting_order() is None


def test_a_file_system_refusing_direct_io_gets_buffered_io_and_the_run_says_so(tmp_path, monkeypatch):
    """Where O_DIRECT is refused (EINVAL at open or at the first request; tmpfs before Linux 6.6, some FUSE and
    network file systems), the engine writes and reads buffered, and the save's engine_statistics name the file
    system; never a failed save. Linux 6.18 here accepts O_DIRECT everywhere, so the refusal is the kernel's answer
    played by os.open."""
    import errno

    real_open = os.open

    def refusing(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    engine = _engine(direct_io=True)
    state = {"w": torch.randn(1000)}
    path = tmp_path / "global_step2" / "mp_rank_00_model_states.pt"
    engine.save(state, str(path))
    engine.wait()
    assert torch.equal(engine.load(str(path))["w"], state["w"])
    assert "Invalid argument (EINVAL)" in engine.statistics()["direct_io_fallback"]


def test_each_saves_statistics_are_its_own(tmp_path, monkeypatch):
    """statistics() is asked once per save (engines/base.py: "since the last call"): the second save's seconds are
    its own, not the first's added to them, and a direct I/O fallback of the first is not the second's."""
    import errno
    import time

    real_open, real_fsync = os.open, os.fsync
    slow = {"on": True}

    def refusing(path, flags, *args):  # the first save's file system refuses O_DIRECT
        if flags & os.O_DIRECT and slow["on"]:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args)

    def fsync(fd):  # and it is slow
        if slow["on"]:
            time.sleep(0.3)
        return real_fsync(fd)

    monkeypatch.setattr(os, "open", refusing)
    monkeypatch.setattr(os, "fsync", fsync)
    engine = _engine()
    figures = []
    for step in (1, 2):
        engine.save({"w": torch.randn(1000)}, str(tmp_path / f"global_step{step}" / "mp_rank_00_model_states.pt"))
        engine.wait_copied()
        engine.wait()
        figures.append(engine.statistics())
        slow["on"] = False
    first, second = figures
    # summed over the saves, the second's would be the first's (its slow fsync included) and more
    assert second["write_seconds"] < first["write_seconds"], figures
    assert "direct_io_fallback" in first and "direct_io_fallback" not in second, figures
    assert second["buffers_reused"] == 1  # the buffers' counts are the run's (as staging_bytes is)


def test_buffers_are_reused_by_later_saves_of_the_same_layout(tmp_path):
    engine = _engine()
    for step in range(3):
        state = {"w": torch.full((256, 256), float(step))}
        engine.save(state, str(tmp_path / f"global_step{step}" / "mp_rank_00_model_states.pt"))
        engine.wait()
        assert torch.equal(engine.load(str(tmp_path / f"global_step{step}" / "mp_rank_00_model_states.pt"))["w"],
                           state["w"])
    assert engine.statistics()["buffers_allocated"] == 1 and engine.statistics()["buffers_reused"] == 2
    # loading the same file twice in a row (DeepSpeed does, for a pp=1 model file) reads it once
    reuse: dict = {}
    path = tmp_path / "global_step2" / "mp_rank_00_model_states.pt"
    first = fmt.load(path, reuse=reuse)
    buffers = reuse["read"][2]
    second = fmt.load(path, reuse=reuse)
    assert reuse["read"][2] is buffers and torch.equal(first["w"], second["w"]) and first["w"] is not second["w"]


def test_writes_follow_the_copy_a_request_at_a_time(tmp_path, monkeypatch):
    """A part larger than a write request is written by several requests, each handed to the writers only once the
    copy has passed its end: the same buffer saved again with other values (it is reused) never reaches the file
    with the old ones, whatever the tensors' sizes and layouts."""
    requests = []
    real = lazy_writers.Writers.write_request

    def counted(self, flush, off):
        requests.append(off)
        return real(self, flush, off)

    monkeypatch.setattr(lazy_writers.Writers, "write_request", counted)
    for direct in (True, False):
        engine = _engine(write_chunk_mib=1, writers=3, direct_io=direct)
        for step in range(2):
            state = {"big": torch.arange(3 * 2**20 // 4 + 7, dtype=torch.float32) * (step + 1),
                     "strided": torch.randn(64, 64)[:, ::2], "small": torch.full((5,), step, dtype=torch.bfloat16),
                     "bigger": torch.randn(2**20 + 3)}
            path = tmp_path / f"d{direct}" / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
            engine.save(state, str(path))
            engine.wait()
            back = fmt.load(path)  # the files, not the engine's buffers
            for k, v in state.items():
                assert torch.equal(back[k], v), (direct, step, k)
        assert engine.statistics()["buffers_reused"] == 1
    assert len(requests) == 2 * 2 * 8  # 7.x MiB a part: 8 requests of 1 MiB, each save


def _ring_state(step: int) -> dict:
    """Tensors of every shape a ring must handle: spanning requests (one strided), within one, empty, gaps."""
    g = torch.Generator().manual_seed(step)
    return {"big": torch.randn(5 * 2**20 // 4 + 7, generator=g), "strided": torch.randn(1024, 1030, generator=g)[:, ::2],
            "small": torch.full((5,), step, dtype=torch.bfloat16), "empty": torch.empty(0, 3),
            "tail": torch.randn(3 * 2**20 // 4 - 100, generator=g), "step": torch.tensor(step)}


@pytest.mark.parametrize("direct", [True, False])
def test_a_ring_buffer_writes_the_same_files_as_a_whole_one(tmp_path, monkeypatch, direct):
    """staging_mib: a part staged in a ring of write requests far smaller than the part gives the files byte for
    byte what a buffer of the whole part gives, save after save (the slots reused, their gaps zeroed), and the copy
    waits for slots while the writes are slow (staging_wait_seconds), never the bytes."""
    import time

    real = lazy_writers.Writers.write_request

    def slow(self, flush, off):
        time.sleep(0.01)
        return real(self, flush, off)

    monkeypatch.setattr(lazy_writers.Writers, "write_request", slow)
    ring, whole = (_engine(write_chunk_mib=1, writers=2, direct_io=direct, staging_mib=m) for m in (3, 0))
    for step in range(3):
        state = _ring_state(step)
        for name, engine in (("ring", ring), ("whole", whole)):
            path = tmp_path / name / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
            engine.save(state, str(path))
            engine.wait_copied()
            engine.wait()
        files = [tmp_path / name / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt" / "part-0.bin"
                 for name in ("ring", "whole")]
        assert files[0].read_bytes() == files[1].read_bytes(), step
        back = fmt.load(files[0].parent)
        assert all(torch.equal(back[k], v) for k, v in state.items()), step
    stats = ring.statistics()
    (staged,) = stats["staging"]
    assert staged["buffer_bytes"] == 3 * 2**20 < staged["part_bytes"] and "a ring of 3 requests" in staged["why"]
    assert stats["staging_bytes"] == {"parts": 1, "part_bytes": staged["part_bytes"], "buffer_bytes": 3 * 2**20}
    assert ring.buffers()["host_bytes"] == 3 * 2**20 and stats["buffers_reused"] == 2
    assert stats["staging_wait_seconds"] > 0 and whole.statistics()["staging_wait_seconds"] == 0
    assert whole.buffers()["host_bytes"] == whole.statistics()["staging"][0]["part_bytes"]


def test_a_failed_write_in_a_ring_stops_the_copy_and_fails_the_save_not_the_step(tmp_path, monkeypatch):
    """A write that fails while the copy waits for its slot: the copy stops, the optimizer step's wait returns, and
    wait() raises the write's error (the harness then never commits the checkpoint)."""
    import errno

    real = os.pwrite
    calls = []

    def failing(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", failing)
    engine = _engine(write_chunk_mib=1, writers=1, staging_mib=2)
    engine.save(_ring_state(0), str(tmp_path / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    engine.wait_copied()
    with pytest.raises(OSError, match="Input/output error"):
        engine.wait()
    assert len(calls) == 2  # the copy stopped at the slot the failed request held: no request after it written


def test_auto_staging_reuses_what_the_writes_clear_within_half_an_optimizer_step():
    """staging_mib=0 (auto): a part is staged whole without a write ceiling, without two optimizer steps before the
    save, or on CUDA; otherwise in a ring of the part less what the writers write in half the interval between
    steps (W T / 2, shared by a checkpoint's parts), never fewer than writers + 1 requests."""
    probe = {"ranks": 2, "ceiling": {"write_mib_s": 200.0}}  # 100 MiB/s a rank
    engine = LazyIO(Options(), None, storage=probe)
    chunk, d = 16 * 2**20, Path("/ckpt/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert engine.saver.staging.choose(d, 160 * 2**20, chunk, pinned=False)[0] is None  # no interval measured yet
    engine.saver.staging.step_marks = [10.0, 11.5, 12.8]  # shortest interval 1.3 s: 65 MiB may lag, 4 requests
    slots, why = engine.saver.staging.choose(d, 160 * 2**20, chunk, pinned=False)
    assert slots == 6 and "a ring of 6 of the part's 10 requests" in why and "1.300 s" in why
    # the same checkpoint's next part: 1 MiB of lag left, under a request: whole
    assert engine.saver.staging.choose(d.with_name("mp_rank_00_model_states.pt"), 160 * 2**20, chunk, pinned=False)[0] is None
    # the next checkpoint starts afresh, and a ring never goes below writers + 1 requests
    engine.saver.staging.step_marks = [0.0, 100.0]
    assert engine.saver.staging.choose(Path("/ckpt/global_step4/x.pt"), 160 * 2**20, chunk, pinned=False)[0] == 5
    assert engine.saver.staging.choose(Path("/ckpt/global_step6/x.pt"), 160 * 2**20, chunk, pinned=True)[0] is None
    assert LazyIO(Options(), None).saver.staging.choose(d, 160 * 2**20, chunk, pinned=False)[1].endswith(
        "(no storage probe with a write figure)")
    assert LazyIO(Options(staging_mib=1), None).saver.staging.choose(d, 160 * 2**20, chunk, pinned=True)[0] == 5
    assert engine.saver.staging.choose(d, 80 * 2**20, chunk, pinned=False) == (
        None, "auto: the whole part: its 5 requests are no more than a ring's least, writers + 1 = 5")


def test_a_request_refused_with_einval_is_written_buffered(tmp_path, monkeypatch):
    """A file system that takes the O_DIRECT open and refuses its requests (some FUSE and network file systems):
    the rest of the part goes through a buffered descriptor, the save's statistics say so, the bytes are right."""
    import errno

    real_open, real_pwrite, direct_fds = os.open, os.pwrite, set()

    def opening(path, flags, *args):
        fd = real_open(path, flags, *args)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def refusing(fd, data, offset):
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "pwrite", refusing)
    engine = _engine(write_chunk_mib=1)
    state = {"w": torch.randn(700_000)}
    path = tmp_path / "global_step2" / "mp_rank_00_model_states.pt"
    engine.save(state, str(path))
    engine.wait()
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert torch.equal(engine.load(str(path))["w"], state["w"])
    assert "Invalid argument (EINVAL)" in engine.statistics()["direct_io_fallback"]


def test_the_way_a_replicated_file_is_loaded_follows_the_measured_bandwidths():
    """broadcast_load=auto (engines/lazy/policy.py replicated_way), once each replica has read its share: broadcasting every
    share (F / B) against reading the other shares (F (d-1) / d / r), so the broadcast where B > r d / (d-1)."""
    from engines.lazy.policy import replicated_way

    mib = 2**20
    # 215 MiB over 2 replicas: gloo's 1,260 MiB/s on this project's machine against a disk read at 1,500 a reader
    gloo = replicated_way(215 * mib, 2, broadcast_mib_s=1260, read_mib_s_per_reader=1500)
    assert gloo.way == "read"
    assert gloo.figures["predicted_read_seconds"] == pytest.approx(107.5 / 1500, abs=1e-5)
    assert gloo.figures["predicted_broadcast_seconds"] == pytest.approx(215 / 1260, abs=1e-5)
    assert "1,260 MiB/s" in gloo.why and "1,500 MiB/s" in gloo.why
    # the same broadcast against a storage shared by many readers (250 MiB/s each), and NCCL against the disk
    assert replicated_way(215 * mib, 2, broadcast_mib_s=1260, read_mib_s_per_reader=250).way == "broadcast"
    assert replicated_way(215 * mib, 2, broadcast_mib_s=40_000, read_mib_s_per_reader=1500).way == "broadcast"
    # more replicas: each reads more of the others' shares, so a slower broadcast still pays (B > r d / (d-1))
    assert replicated_way(215 * mib, 8, broadcast_mib_s=1500, read_mib_s_per_reader=1200).way == "broadcast"
    assert replicated_way(215 * mib, 2, broadcast_mib_s=1500, read_mib_s_per_reader=1200).way == "read"
    unknown = replicated_way(215 * mib, 2, broadcast_mib_s=None, read_mib_s_per_reader=None)
    assert unknown.way == "broadcast" and "no storage read bandwidth" in unknown.why


def test_reads_go_the_way_the_storage_probe_read_fastest():
    """read_io=auto reads the way the run's ceiling probe (files/baseline.py) read faster in this engine's own
    shape, O_DIRECT or buffered, whichever the read ceiling itself came from (the baseline's single buffered stream
    is not a way the engine reads); a probe without a buffered read (before 2026-11-27) goes by the ceiling's
    source; without a probe with a ceiling, direct_io's way. An explicit read_io is taken as given."""
    from engines.lazy.policy import read_way

    def storage(source, direct=850.0, buffered=1100.0):
        return {"read_mib_s": 1300.0, "ceiling": {"read_from": source, "direct": {"read_mib_s": direct,
                                                                               "buffered_read_mib_s": buffered}}}

    for source in ("direct", "buffered", "baseline"):
        way = read_way(Options(), storage(source))
        assert way.way == "buffered" and "buffered 1,100 MiB/s against O_DIRECT 850" in way.why, way
        way = read_way(Options(), storage(source, direct=1420.0))
        assert way.way == "direct" and "O_DIRECT 1,420 MiB/s against buffered 1,100" in way.why, way
    assert read_way(Options(), storage("baseline", buffered=None)).way == "buffered"
    assert read_way(Options(), storage("direct", buffered=None)).way == "direct"
    assert read_way(Options(), None) == Decision("direct", "no storage probe with a ceiling to go by: direct_io=true")
    assert read_way(Options(direct_io=False), {"error": "no space"}).way == "buffered"
    assert read_way(Options(read_io="direct"), storage("baseline")) == Decision("direct", "read_io=direct")
    # a probe of one 16 MiB request a thread (64 MiB a rank, 4 threads) times a request's latency: not chosen by
    small = storage("fio", direct=310.0, buffered=1266.0)
    small.update(file_bytes=64 << 20)
    small["ceiling"]["direct"].update(request_bytes=16 << 20, queue_depth=4)
    way = read_way(Options(), small)
    assert way.way == "direct" and "1.0 requests a reader thread" in way.why, way
    small["file_bytes"] = 256 << 20  # four requests a thread: a stream's pace, chosen by
    assert read_way(Options(), small).way == "buffered"


def test_the_ranks_own_zero_file_is_read_ahead_while_the_model_file_loads(tmp_path):
    """The first load of a tag queues this rank's own ZeRO file (DeepSpeed's name for it) behind its own reads; its
    load then waits for those reads instead of reading again."""
    class Stub:  # the parts of a DeepSpeed engine the engine asks
        optimizer = None
        global_steps = 2

        def _take_model_step(self):
            pass

        def zero_optimization(self):
            return True

        def zero_elastic_checkpoint(self):
            return False

        def _get_zero_ckpt_name(self, root, tag):
            return os.path.join(root, tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt")

    engine = LazyIO(Options(), Stub())
    tag = tmp_path / "global_step2"
    model, optim = {"w": torch.randn(300, 300)}, {"m": torch.randn(1000, 100), "step": 3}
    engine.save(model, str(tag / "mp_rank_00_model_states.pt"))
    engine.save(optim, str(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    engine.wait()
    restarted = LazyIO(Options(), Stub())
    assert torch.equal(restarted.load(str(tag / "mp_rank_00_model_states.pt"))["w"], model["w"])
    ahead = restarted.load_statistics()["prefetched_bytes"]
    assert ahead >= 1000 * 100 * 4 and str(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt") in restarted.loader.prefetch
    back = restarted.load(str(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    assert torch.equal(back["m"], optim["m"]) and back["step"] == 3 and not restarted.loader.prefetch
    assert restarted.load_statistics()["read_bytes"] >= ahead  # counted once, when used


def test_pinned_buffers_are_registered_at_their_exact_size(monkeypatch):
    """On CUDA a staging buffer is page-locked by registering its own allocation (cudaHostRegister), not taken from
    torch's pinned allocator, which rounds every block up to a power of two; it is unregistered when freed. No GPU
    here: CUDA's runtime is played by a stand-in that records the calls."""
    import gc

    calls = []

    class Cudart:
        def cudaHostRegister(self, ptr, n, flags):
            calls.append(("register", ptr, n))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    size = 3 * 2**20 + 5  # a power-of-two allocator would take 4 MiB
    buf = buffers.aligned_empty(size, pinned=True, zeroed=True)
    assert buf.numel() == size and buf.data_ptr() % buffers.ALIGNMENT == 0 and int(buf.sum()) == 0
    (kind, ptr, n), = calls
    assert (kind, ptr, n) == ("register", buf.data_ptr(), buffers.aligned(size))
    del buf
    gc.collect()
    assert calls[-1] == ("unregister", ptr)


@pytest.fixture(scope="module")
def lazy_dp2(harness) -> Path:
    return harness.run("lazy-dp2")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lazy-dp2", "lazy-tp2-pp2-dp2"])
def test_lazy_saves_restarts_and_verifies(harness, name):
    run_dir = harness.run(name)
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete" and summary["restart"]["verified"] is True
    saves = [e for evs in events(run_dir).values() for e in evs if e["event"] == "save"]
    assert saves and all(s["async"] and s["blocking_seconds"] <= s["durable_seconds"] <= s["commit_seconds"]
                         for s in saves)
    assert all(s["engine_statistics"]["copy_seconds"] > 0 for s in saves)  # the copies happened, off the save
    inventory = json.loads((run_dir / "inventory.json").read_text())
    tops = {f["path"].split("/")[0] for f in inventory["files"] if "/" in f["path"]}
    headers = {f["path"].split("/")[0] for f in inventory["files"] if f["path"].endswith("/header.json")}
    assert tops == headers  # every DeepSpeed file is a directory in the format
    writers = {f["rank"] for f in inventory["files"] if f["kind"] in ("model_states", "layer_states")}
    # model weights are no longer all written by data-parallel rank 0: with dp=2 both replicas write some
    dp_ranks = {json.loads(line)["dp_rank"] for p in (run_dir / "events" / "checkpoint").glob("rank-*.jsonl")
                for line in p.read_text().splitlines() if json.loads(line)["event"] == "layout"
                and json.loads(line)["rank"] in writers}
    assert dp_ranks == {0, 1}
    staged = [p for s in saves for p in s["engine_statistics"]["staging"]]
    told = summary["checkpoint"]["engine_staging"]  # the rank with the most buffer bytes (the terminal's staging row)
    if name == "lazy-tp2-pp2-dp2":  # staging_mib=1, writers=1: rings of 2 requests where a part spans more
        rings = [p for p in staged if p["buffer_bytes"] < p["part_bytes"]]
        assert rings and all(p["buffer_bytes"] == 2 * 2**20 and "a ring of 2 requests" in p["why"] for p in rings)
        assert told["rings"] >= 1 and told["buffer_bytes"] < told["part_bytes"], told
    else:  # auto: the tiny parts fit in fewer requests than a ring holds
        assert all(p["buffer_bytes"] == p["part_bytes"] for p in staged), staged
        assert told["rings"] == 0 and told["buffer_bytes"] == told["part_bytes"], told
    if name == "lazy-dp2":
        # broadcast_load=auto with both replicas on this node: each read its share of the replicated model file into
        # one shared-memory mapping, said so, left nothing in /dev/shm, and the restart read the checkpoint once;
        # the reads went the way the run's storage probe read fastest, and said why
        restart = summary["restart"]
        stats = restart["engine_load_statistics"]
        (way,) = stats["replicated"]
        assert way["file"] == "mp_rank_00_model_states.pt" and way["seconds"] > 0, way
        assert stats["prefetched_bytes"] > 0  # each rank's optimizer file read ahead meanwhile
        assert stats["read_io"]["way"] in ("direct", "buffered") and stats["read_io"]["why"], stats
        # every 16 MiB request counted over the ranks, and those whose fresh pages a thread faulted in ahead of it
        assert stats["read_requests"] > 0 and 0 <= stats["populated_requests"] <= stats["read_requests"], stats
        probe = ((summary.get("baseline") or {}).get("ceiling") or {}).get("direct") or {}
        if "stream's pace" in stats["read_io"]["why"]:  # the probe moved too few requests a reader thread to go by
            assert stats["read_io"]["way"] == "direct", stats  # (engines/lazy/policy.py HOLD_REQUESTS): direct_io
        elif probe:  # the faster of the probe's two reads in the engine's shape (every probe records both)
            faster = "direct" if probe["read_mib_s"] >= probe["buffered_read_mib_s"] else "buffered"
            assert stats["read_io"]["way"] == faster, (stats, probe)
        storage_read = restart["load_breakdown"]["storage_read"]["bytes"]
        assert not list(Path("/dev/shm").glob("rh-lazy-*"))
        if way["way"] == "shared":
            assert "on this node" in way["why"] and stats["shared_bytes"] > 0, way
            assert storage_read <= summary["checkpoint"]["bytes"] + 4096, restart
            assert stats["broadcast_loads"] == 0, stats
            return
        # where /dev/shm cannot hold it: the measured choice, with its figures and why not shared
        assert "not shared memory" in way["why"], way
        assert way["predicted_broadcast_seconds"] > 0 and way["predicted_read_seconds"] > 0, way
        assert "MiB/s over the data-parallel group" in way["why"] and "a reader" in way["why"], way
        if way["way"] == "broadcast":
            # read once by the data-parallel group (each part by one replica) and broadcast: the restart reads from
            # storage what the checkpoint holds (and `latest`), not the model file once a replica
            assert storage_read <= summary["checkpoint"]["bytes"] + 4096, restart
            assert stats["broadcast_loads"] == 2 and stats["broadcast_bytes"] > 0  # one file, on both replicas
        else:
            assert stats["broadcast_loads"] == 0 and storage_read > summary["checkpoint"]["bytes"], restart


@pytest.mark.slow
def test_a_restart_re_run_may_change_how_the_engine_reads(lazy_dp2, tmp_path):
    """The engine's options that act only at restart (read_io, readers, broadcast_load) may change in a restart-only
    re-run; one the checkpoint depends on may not (one line, exit 2, nothing launched). Forced to the broadcast
    with O_DIRECT reads, the re-run broadcasts the replicated file and says why it read so."""
    run = copy_run(lazy_dp2, tmp_path)
    refused = restart(run, "write_chunk_mib=1")
    assert refused.returncode == 2, refused.stderr
    line, = refused.stderr.strip().splitlines()
    assert "write_chunk_mib=1" in line and "read_io" in line and "broadcast_load" in line, line
    proc = restart(run, "read_io=direct", "broadcast_load=true", "attribution=off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = load_summary(run)
    latest = summary["restarts"][-1]
    stats = latest["engine_load_statistics"]
    assert latest["verified"] is True and stats["read_io"] == {"way": "direct", "why": "read_io=direct"}, stats
    (way,) = stats["replicated"]
    assert way["way"] == "broadcast" and way["why"] == "broadcast_load=true", way
    assert stats["broadcast_loads"] == 2 and stats["broadcast_bytes"] > 0, stats
    assert json.loads((run / "spec.json").read_text())["engine_options"]["read_io"] == "auto"  # the run's own spec


@pytest.mark.slow
def test_converted_checkpoint_equals_the_default_engines(lazy_dp2, tiny_dp2, tmp_path):
    """Same run (tiny dp=2, same seed and steps) with engine=lazy and engine=default: the lazy checkpoint converted
    to DeepSpeed's layout holds the same tensors in the same files, and DeepSpeed's zero_to_fp32 reads it."""
    src = lazy_dp2 / "checkpoint" / "global_step4"
    out = tmp_path / "converted" / "global_step4"
    proc = subprocess.run([sys.executable, "-m", "engines.lazy.format", "to-torch-save", str(src), str(out)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    default = tiny_dp2 / "checkpoint" / "global_step4"
    names = sorted(p.name for p in default.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names

    def tensors(obj, prefix=""):
        if isinstance(obj, torch.Tensor):
            yield prefix, obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                yield from tensors(v, f"{prefix}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                yield from tensors(v, f"{prefix}/{i}")

    for name in names:
        if not name.endswith(".pt"):
            continue
        a = dict(tensors(torch.load(default / name, weights_only=False)))
        b = dict(tensors(torch.load(out / name, weights_only=False)))
        assert a.keys() == b.keys(), name
        for k, t in a.items():
            assert t.dtype == b[k].dtype and torch.equal(t, b[k]), (name, k)
    (out.parent / "latest").write_text("global_step4")
    script = ("import sys, torch; from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint "
              "as f; a = f(sys.argv[1]); b = f(sys.argv[2]); assert a.keys() == b.keys() and a; "
              "assert all(torch.equal(a[k], b[k]) for k in a); print(len(a))")
    proc = subprocess.run([sys.executable, "-c", script, str(out.parent), str(default.parent)], capture_output=True,
                          text=True, cwd=REPO, check=False, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0 and int(proc.stdout.strip().splitlines()[-1]) > 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_rank_killed_mid_flush_leaves_latest_on_the_last_durable_checkpoint(tmp_path):
    proc = run_cli(["tiny", "dp=2", "engine=lazy", "iters=4", "save_interval=2", "after=1", "baseline=false"],
                   tmp_path, check=False, env={"RH_FAULT": "kill@flush:rank=1:step=4"})
    assert proc.returncode == 1 and "checkpoint phase" in proc.stderr.strip().splitlines()[-1]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    ckpt = run_dir / "checkpoint"
    assert (ckpt / "latest").read_text() == "global_step2"
    assert (ckpt / "global_step4").is_dir()  # written in part, never committed
    env = {k: v for k, v in os.environ.items() if k != "RH_FAULT"}
    again = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "restart", f"run={run_dir}"],
                           capture_output=True, text=True, cwd=REPO, check=False, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    restart = load_summary(run_dir)["restart"]
    assert restart["tag"] == "global_step2" and restart["verified"] is True
