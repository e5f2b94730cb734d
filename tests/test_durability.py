"""What makes a save durable inside durable_seconds (worker/manager.py): where an engine's own wait does not fsync its
files (Engine.durable_on_wait False: DataStates' state_engine, whose wait(persist=True) returns once io_uring's writes
completed), the harness's fsync of every file and folder runs after that wait, before durable_seconds is stamped and
before `latest` is committed. The real CheckpointManager, the real file-system target and DataStates' real plug-in and
CheckpointIO class; in place of DataStates-LLM itself, which cannot run without CUDA, a writer thread that writes the
file after save() returned and never fsyncs it. And DataStatesIO's own accounting: its pinned cache, the restore copies
its loads keep, and a sys.exit inside DataStates made an error with its cause."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from engines import registry
from engines.datastates import DataStatesIO, tensor_bytes
from restart_harness.command import parse_args
from restart_harness.targets.filesystem import FileSystemStore, FileSystemTarget
from restart_harness.worker.anatomy import Anatomy
from restart_harness.worker.eventlog import EventLog
from restart_harness.worker.manager import CheckpointManager


class Timeline(FileSystemStore):
    """The file-system target's store, its make_durable and commit_latest stamped as they run (and still done)."""

    def __init__(self, root: Path):
        super().__init__(FileSystemTarget(None, root))
        self.stamps: dict[str, float] = {}
        self.durable_paths: list[str] = []

    def make_durable(self, paths) -> None:
        if paths and str(paths[0]).endswith(".pt"):  # the rank's files (the tag folder comes at the commit)
            self.stamps["fsync_start"] = time.perf_counter()
            super().make_durable(paths)
            self.stamps["fsync_end"] = time.perf_counter()
            self.durable_paths = [str(p) for p in paths]
        else:
            super().make_durable(paths)

    def commit_latest(self, tag: str) -> None:
        self.stamps["commit"] = time.perf_counter()
        super().commit_latest(tag)


class FlushingWriter:
    """Stands in for DataStates-LLM (its constructor needs CUDA): save() queues the write to a thread and returns;
    ckpt_engine.wait(persist=True) returns once the bytes were written - never fsync'd, as DataStates 1b84990's."""

    def __init__(self):
        self.threads: list[threading.Thread] = []
        self.ckpt_engine = self
        self.waited_at: float | None = None

    def save(self, state, path):
        def write():
            time.sleep(0.05)
            Path(path).write_bytes(b"x" * 8192)

        self.threads.append(threading.Thread(target=write))
        self.threads[-1].start()

    def wait(self, persist=False):
        for t in self.threads:
            t.join()
        self.waited_at = time.perf_counter()


class OneRank:
    """The part of a training stack (restart_harness/stacks/) the manager drives: one rank saving one file a step."""

    rank, device, untimed = 0, None, {"save": (), "load": ()}

    def attach(self, recorder):
        self.recorder = recorder

    def record_digests(self, tag):
        return None

    def save(self, root, tag, step, recorder, untimed):
        (Path(root) / tag).mkdir(parents=True, exist_ok=True)
        recorder.save({"w": torch.ones(4)}, str(Path(root) / tag / "mp_rank_00_model_states.pt"))
        return {}


@pytest.fixture
def one_rank_group(tmp_path):
    """A process group of this one rank: the manager's collectives (rank_env) are real ones."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_an_engine_whose_wait_does_not_fsync_is_made_durable_inside_the_window(tmp_path, one_rank_group):
    spec = parse_args(["small", "engine=datastates", "device=cuda"])
    engine = registry.get("datastates")(spec)
    assert engine.durable_on_wait is False and engine.asynchronous()
    writer, target = FlushingWriter(), Timeline(tmp_path / "checkpoint")
    io = DataStatesIO(writer, target, engine.host_cache_bytes())
    log = EventLog(tmp_path / "rank-00000.jsonl", 0)
    manager = CheckpointManager(OneRank(), engine, io, target, Anatomy("cpu"), log)
    manager.save(2)
    manager.finish()
    log.close()
    save = next(json.loads(x) for x in (tmp_path / "rank-00000.jsonl").read_text().splitlines()
                if json.loads(x)["event"] == "save")
    s = target.stamps
    # DataStates' wait returned, then the harness fsync'd the rank's file, then `latest` was committed
    assert writer.waited_at <= s["fsync_start"] <= s["fsync_end"] <= s["commit"]
    assert target.durable_paths == [str(tmp_path / "checkpoint/global_step2/mp_rank_00_model_states.pt")]
    # ... inside durable_seconds, which the save event says and splits
    d = save["durability"]
    assert d["by"] == "harness fsync" and d["make_durable_seconds"] > 0 and d["engine_wait_seconds"] > 0
    assert save["durable_seconds"] >= d["engine_wait_seconds"] + d["make_durable_seconds"]
    assert save["durable_seconds"] >= s["fsync_end"] - s["fsync_start"]
    assert (tmp_path / "checkpoint/latest").read_text().strip() == "global_step2"


@pytest.mark.parametrize("name, fsyncs", [("datastates", False), ("default", False), ("torchsnapshot", False),
                                          ("dcp", True), ("fastpersist", True), ("decoupled", True), ("lazy", True)])
def test_every_engine_says_whether_its_wait_makes_files_durable(name, fsyncs):
    assert registry.get(name).durable_on_wait is fsyncs


class RestoringEngine:
    """Stands in for DataStates' engine at a restart: load returns fresh tensors (DataStates 1b84990 returns views
    of restore buffers it never frees); a load of `bad` logs an error and exits, as DataStates does."""

    def load(self, path, map_location=None):
        if path.endswith("bad"):
            logging.getLogger("datastates.engines.engine_state").error("Could not load %s, exception: boom", path)
            sys.exit(-1)
        return {"module": {"w": torch.zeros(256), "v": torch.zeros(128, dtype=torch.bfloat16)}, "step": 4}

    def save(self, state, path):
        sys.exit(-1)  # before logging anything


def test_datastates_io_counts_its_host_cache_and_the_restore_copies_it_keeps(tmp_path):
    io = DataStatesIO(RestoringEngine(), FileSystemStore(FileSystemTarget(None, tmp_path)), 512 << 20)
    assert io.buffers() == {"host_bytes": 512 << 20, "pinned_bytes": 512 << 20, "restore_kept_bytes": 0}
    for _ in range(2):
        io.load(str(tmp_path / "mp_rank_00_model_states.pt"))
    kept = 2 * (256 * 4 + 128 * 2)
    assert io.buffers() == {"host_bytes": (512 << 20) + kept, "pinned_bytes": 512 << 20, "restore_kept_bytes": kept}
    assert io.load_statistics() == {"restore_kept_bytes": kept, "host_cache_bytes": 512 << 20}
    shared = torch.zeros(10)
    assert tensor_bytes({"a": shared, "b": [shared, shared[2:]]}) == 40  # a storage counted once


def test_datastates_exit_becomes_an_error_with_its_cause(tmp_path):
    io = DataStatesIO(RestoringEngine(), FileSystemStore(FileSystemTarget(None, tmp_path)), 1 << 20)
    with pytest.raises(RuntimeError, match=r"sys.exit\(-1\): Could not load .*bad, exception: boom"):
        io.load(str(tmp_path / "bad"))
    with pytest.raises(RuntimeError, match=r"sys.exit\(-1\): it logged no error"):
        io.save({}, str(tmp_path / "x.pt"))
    assert not logging.getLogger("datastates").handlers  # its handler is removed again (third_party/datastates_exit.py)
    with contextlib.suppress(RuntimeError):
        io.load(str(tmp_path / "bad"))


def test_datastates_exit_shim_still_needed():
    """third_party/datastates_exit.py exists because DataStates' engines end errors with sys.exit: read in the pinned
    sources (the assembled tree, where it is here). Fails once they raise instead."""
    import tarfile

    from conftest import REPO

    tarball = REPO.parent / "shared/deps/datastates-llm/datastates-llm-1b84990-assembled.tar.gz"
    if not tarball.is_file():
        pytest.skip(f"{tarball} is not here (the shared folder of assembled DataStates-LLM trees)")
    with tarfile.open(tarball) as t:
        source = t.extractfile("datastates-llm-1b84990/llm/datastates/engines/engine_state.py").read().decode()
    assert "sys.exit(-1)" in source and "except Exception" in source, "DataStates raises now: drop the shim"
