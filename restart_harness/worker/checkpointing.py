"""Save and load through DeepSpeed's own save_checkpoint / load_checkpoint, with the installed checkpoint
engine wrapped so every file it writes or reads is timed, and with durability made explicit:

  blocking_seconds  wall time inside engine.save_checkpoint() on this rank (what training waits for)
  durable_seconds   from the same start until every file this rank wrote is fsync'd (file data, then the
                    directories that name them), after the plug-in's wait_durable() for async engines
  commit_seconds    from the same start until `latest` names the tag: after a barrier (all ranks durable)
                    rank 0 writes `latest` to a temp file, fsyncs it, renames it over `latest`, fsyncs the
                    directory. DeepSpeed's own `latest` write (before its last barrier, never fsync'd) is
                    disabled with save_latest=False, so `latest` never names a torn checkpoint.

Async engines (torchsnapshot async_take, dcp async_save, and DeepSpeed's decoupled engines: datastates,
decoupled) return from save_checkpoint before the files are written. A per-rank waiter thread then waits for the
engine's flush (or, for DeepSpeed-decoupled engines, for DeepSpeed's own commit in the next engine.step()),
fsyncs the files and stamps durable_seconds the moment that finishes. Training goes on meanwhile; `latest` is
committed (barrier + atomic write) only once every rank is durable: checked at each step boundary (one MIN
all-reduce of a done flag), and waited for before the next save and at the end of the phase.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from restart_harness.storage.atomic import files_under, fsync_paths, write_text_atomic
from restart_harness.worker import faults
from restart_harness.worker.anatomy import LOAD_CATEGORIES, SAVE_CATEGORIES, Anatomy


class RecordingEngine(CheckpointEngine):
    """Delegates to the real CheckpointEngine; records path and seconds of every save and load call, and attributes
    them to the anatomy's serialize/write/fsync (save) and read/deserialize (load) categories."""

    def __init__(self, inner: CheckpointEngine, anatomy: Anatomy):
        self.inner = inner
        self.anatomy = anatomy
        self.name = f"Recording({getattr(inner, 'name', type(inner).__name__)})"
        self.saved: list[tuple[str, float]] = []
        self.loaded: list[tuple[str, float]] = []
        self.step: int | None = None  # training step of the save in progress (for fault injection)
        self.committed = threading.Event()  # set when DeepSpeed commits a decoupled engine's checkpoint

    def create(self, info):
        return self.inner.create(info)

    def save(self, state_dict, path: str):
        start = time.perf_counter()
        with self.anatomy.region("serialize", io=("write", "sync")):
            result = self.inner.save(state_dict, path)
        seconds = time.perf_counter() - start
        # An engine that writes only part of what `path` names (engine=lazy's shares of a replicated file) returns
        # the files it writes; otherwise everything under path is this rank's.
        written = result if isinstance(result, list) else [path]
        self.saved += [(p, seconds / len(written)) for p in written]
        faults.hit("save", int(os.environ.get("RANK", "0")), self.step)
        return result

    def load(self, path: str, map_location=None):
        start = time.perf_counter()
        with self.anatomy.region("deserialize", io=("read",)):
            result = self.inner.load(path, map_location=map_location)
        self.loaded.append((path, time.perf_counter() - start))
        return result

    def makedirs(self, path, exist_ok=False):
        return self.inner.makedirs(path, exist_ok=exist_ok)

    def commit(self, info):
        result = self.inner.commit(info)
        self.committed.set()
        return result

    def is_data_parallel_writer(self, dp_rank):
        return self.inner.is_data_parallel_writer(dp_rank)

    def is_decoupled(self):
        return self.inner.is_decoupled()

    def set_commit_info(self, info):
        return self.inner.set_commit_info(info)

    def get_commit_info(self):
        return self.inner.get_commit_info()

    def cleanup(self):
        return self.inner.cleanup()

    def preserves_storage_sharing(self):
        return self.inner.preserves_storage_sharing()

    def __getattr__(self, name):  # engine-specific extras (wait, ...)
        return getattr(self.__dict__["inner"], name)


def client_state(spec, step: int) -> dict:
    """What every checkpoint carries beside DeepSpeed's state: the step, and the universal-checkpoint information
    DeepSpeed's ds_to_universal needs to reshard it later (which parameters are row-parallel, TP-replicated,
    vocabulary-parallel; restart_harness/spec/parameters.py)."""
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    from restart_harness.spec.parameters import universal_checkpoint_patterns

    info = {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE,
            **universal_checkpoint_patterns(spec.shape)}
    return {"harness_step": step, UNIVERSAL_CHECKPOINT_INFO: info}


def install(ds_engine, plugin, anatomy: Anatomy) -> RecordingEngine:
    """Install the plug-in's CheckpointEngine (if it brings one) and wrap it for recording; hook the copies into
    the engine's state and DeepSpeed's collectives into the anatomy."""
    replacement = plugin.checkpoint_engine(ds_engine)
    if replacement is not None:
        ds_engine.checkpoint_engine = replacement
    recorder = RecordingEngine(ds_engine.checkpoint_engine, anatomy)
    ds_engine.checkpoint_engine = recorder
    if plugin.store is not None:
        plugin.store.region = anatomy.region
    anatomy.wrap(ds_engine, "load_module_state_dict", "copy")
    if ds_engine.optimizer is not None:  # a universal load reads its files in here: those reads count as reads
        anatomy.wrap(ds_engine.optimizer, "load_state_dict", "copy", io=("read",))
    anatomy.hook_collectives()
    return recorder


def save(ds_engine, recorder: RecordingEngine, plugin, ckpt_root: Path, tag: str, client_state: dict,
         rank: int, barrier) -> dict:
    """One checkpoint, durable and committed; returns this rank's save record (seconds, files, bytes)."""
    anatomy = recorder.anatomy
    recorder.saved.clear()
    recorder.step = client_state.get("harness_step")
    wall_start = time.time()
    start = time.perf_counter()
    with anatomy.measure(SAVE_CATEGORIES) as window:
        try:
            ds_engine.save_checkpoint(str(ckpt_root), tag=tag, client_state=client_state, save_latest=False)
        except Exception as exc:
            raise _explain_save_failure(exc, ckpt_root, tag) from exc
        blocking = time.perf_counter() - start
        with anatomy.region("fsync"):
            plugin.wait_durable(recorder.inner)
            mine = [f for path, _ in recorder.saved for f in files_under(Path(path))]
            fsync_paths(mine)
        durable = time.perf_counter() - start
        commit_latest(ckpt_root, tag, rank, barrier, anatomy, plugin.store)
        committed = time.perf_counter() - start
        record = window.close()
    files = file_records(recorder.saved, ckpt_root / tag, plugin.store)
    return {
        "tag": tag,
        "start": wall_start,
        "blocking_seconds": blocking,
        "durable_seconds": durable,
        "commit_seconds": committed,
        "files": files,
        "bytes": sum(f["bytes"] for f in files),
        "anatomy": record,
        "universal_info": True,  # client_state() carried it: ds_to_universal can convert this checkpoint
    }


def commit_latest(ckpt_root: Path, tag: str, rank: int, barrier, anatomy: Anatomy, store=None) -> None:
    """Every rank calls this once its files are durable: barrier, then rank 0 atomically points `latest` at tag
    (and, for an object store, writes the `latest` object too: a single PUT is atomic)."""
    with anatomy.region("wait"):
        barrier()
    if rank == 0:
        with anatomy.region("fsync"):
            fsync_paths(files_under(ckpt_root / tag))  # files DeepSpeed writes outside the engine (recovery scripts)
        if store is not None:
            store.put_text(ckpt_root / "latest", tag)
        write_text_atomic(ckpt_root / "latest", tag)
    with anatomy.region("wait"):
        barrier()


def file_records(saved: list[tuple[str, float]], tag_dir: Path, store=None) -> list[dict]:
    """path (relative to the tag dir), bytes (all shards of a directory) and seconds of each engine.save() call; for
    an object store, the bytes of the objects the path names (never the local placeholders')."""
    def size(path: str) -> int:
        if store is not None:
            return sum(n for _, n in store.objects(path))
        return sum(f.stat().st_size for f in files_under(Path(path)))

    return [{"path": str(Path(path).relative_to(tag_dir)), "bytes": size(path), "seconds": seconds}
            for path, seconds in saved]


def object_store(run_dir: Path, ckpt_root: Path, plugin) -> None:
    """ckpt_dir=s3://...: give the plug-in the run's ObjectStore (spec.json's checkpoint_url) before it builds its
    checkpoint engine."""
    from restart_harness.storage.atomic import read_json

    url = read_json(run_dir / "spec.json").get("checkpoint_url")
    if url:
        from restart_harness.storage.s3 import ObjectStore, S3Settings, S3Url

        settings = S3Settings.from_environment()
        settings.export()
        plugin.store = ObjectStore(ckpt_root, S3Url.parse(url), settings)


FULL_DISK_BYTES = 1 << 20


def _explain_save_failure(exc: Exception, ckpt_root: Path, tag: str) -> Exception:
    """torch.save reports a full disk as 'unexpected pos ...' from its zip writer: name the real cause."""
    try:
        free = shutil.disk_usage(ckpt_root).free
    except OSError:
        return exc
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or free < FULL_DISK_BYTES:
        return OSError(errno.ENOSPC, f"No space left on device while saving {tag}: {free} bytes free on the "
                                     f"checkpoint filesystem at {ckpt_root} ({type(exc).__name__}: {exc})")
    return exc


def measured_load(engine, recorder: RecordingEngine, ckpt_root: Path, tag: str | None, log, peak_memory,
                  sync) -> tuple[str, dict]:
    """The restart's checkpoint_load phase: load() and sync() (queued device copies belong to it) inside the anatomy
    window, whose own start and end the phase's marks carry; the memory of engine_init is read before the window
    opens. With anatomy=false (no window record) the start is taken here: a mark stamped afterwards would put the
    whole load into engine_init. Emits the files loaded and the breakdown; returns load()'s (tag, client_state)."""
    engine_init_memory = peak_memory()
    load_start = time.time()
    with recorder.anatomy.measure(LOAD_CATEGORIES) as window:
        loaded_tag, client_state = load(engine, ckpt_root, tag)
        sync()
        breakdown = window.close()
    log.mark("engine_initialized", t=breakdown["start"] if breakdown else load_start, memory=engine_init_memory)
    log.mark("checkpoint_loaded", t=breakdown["end"] if breakdown else None)
    log.emit("loaded", tag=loaded_tag, files=[{"path": p, "seconds": s} for p, s in recorder.loaded])
    if breakdown:
        log.emit("load_anatomy", **breakdown)
    return loaded_tag, client_state


def load(ds_engine, ckpt_root: Path, tag: str | None = None) -> tuple[str, dict]:
    """Load the checkpoint `latest` names (or `tag`: a universal checkpoint beside it); a missing or unreadable one
    is an error, never a silent no-op."""
    latest = ckpt_root / "latest"
    if tag is None:
        if not latest.is_file():
            raise FileNotFoundError(f"no 'latest' file in {ckpt_root}: nothing committed to restart from")
        tag = latest.read_text().strip()
    path, client_state = ds_engine.load_checkpoint(str(ckpt_root), tag=tag)
    if path is None:
        raise RuntimeError(f"DeepSpeed load_checkpoint found no checkpoint for tag {tag!r} in {ckpt_root}")
    return tag, client_state or {}
