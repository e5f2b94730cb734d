"""One rank's checkpoint manager: the only code that saves, waits for durability, commits `latest` and loads; every file
through the Recorder to the engine's CheckpointIO. Each figure and the asynchronous protocol: docs/measurements.md."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from restart_harness import faults
from restart_harness.files import checksum
from restart_harness.iocount import delta
from restart_harness.rank_env import all_true, barrier, max_of, sync
from restart_harness.schema import LOAD_CATEGORIES, SAVE_CATEGORIES, Digest, LoadAnatomy, Loaded, Save
from restart_harness.stacks.base import digests_written
from restart_harness.worker.memory import added


class Recorder:
    """Every file the stack saves or loads, through the engine's CheckpointIO: timed, attributed to the anatomy's
    serialize/write/fsync (save) and read/deserialize (load) categories, made findable on the target."""

    def __init__(self, io, target, anatomy, rank: int):
        self.io, self.target, self.anatomy, self.rank = io, target, anatomy, rank  # io: the engine's CheckpointIO
        self.native = io.native  # DeepSpeed's own checkpoint engine, where the chosen engine is that one
        self.saved: list[tuple[str, float]] = []
        self.loaded: list[tuple[str, float]] = []
        self.step: int | None = None  # training step of the save in progress (for fault injection)
        self.committed = threading.Event()  # DeepSpeed committed a decoupled engine's checkpoint
        self.untimed = 0.0  # seconds the stack has marked untimed so far (CheckpointManager.untimed), to leave out

    def save(self, state, path: str) -> list[str]:
        start, untimed = time.perf_counter(), self.untimed
        with self.anatomy.region("serialize", io=("write", "sync")):
            written = self.io.save(state, path)
        seconds = time.perf_counter() - start - (self.untimed - untimed)  # a streamed file's data made, digested
        self.target.written(written)
        self.saved += [(p, seconds / len(written)) for p in written]
        faults.hit("save", self.rank, self.step)
        return written

    def load(self, path: str, map_location=None, into=None):
        start, untimed = time.perf_counter(), self.untimed
        with self.anatomy.region("deserialize", io=("read",)):
            state = self.io.load(path, map_location=map_location, into=into)
        self.loaded.append((self.io.read_path(path), time.perf_counter() - start - (self.untimed - untimed)))
        return state

    def flush(self) -> None:
        """Until the engine has written everything saved so far (a stack that holds one file at a time)."""
        with self.anatomy.region("fsync"):
            self.io.wait()


class _Pending:
    """One save on this rank between its start and its commit; the waiter stamps durable_at (perf_counter)."""

    def __init__(self, tag: str, step: int, memory):
        self.tag, self.step = tag, step
        self.memory = memory  # worker/memory.py Window from the save's start to its commit
        self.wall_start, self.start = time.time(), time.perf_counter()
        self.blocking = self.untimed = 0.0
        self.saved: list[tuple[str, float]] = []
        self.facts: dict = {}  # the fields the stack adds to the save record
        self.anatomy: dict | None = None  # the save window (worker/anatomy.py); an async save's blocking part only
        self.flush: dict | None = None  # the background part: seconds, and write/fsync busy seconds in it
        self.engine_statistics: dict | None = None
        self.durability: dict | None = None  # who made the files durable, and each part's seconds
        self.durable_at: float | None = None
        self.returned_io: dict | None = None  # the I/O counters when the save returned
        self.committed_at: float | None = None
        self.commit_seconds: float | None = None
        self.error: BaseException | None = None
        self.in_flight_steps = 0
        self.thread: threading.Thread | None = None
        self.returned: tuple = (None, None)  # (host RSS, device bytes) when the stack's save returned
        self.buffers: dict | None = None  # the engine's own buffers then (CheckpointIO.buffers)


class CheckpointManager:
    def __init__(self, stack, engine, io, target, anatomy, log, memory=None):
        self.stack, self.target, self.anatomy, self.log = stack, target, anatomy, log
        self.recorder = Recorder(io, target, anatomy, stack.rank)
        self.waits_for_deepspeed = engine.committed_by_deepspeed
        self.engine_fsyncs = engine.durable_on_wait
        self.checksums = engine.checksums(target.target)
        self.asynchronous = engine.asynchronous() or self.waits_for_deepspeed
        self.memory = memory  # worker/memory.py MemoryProbe; None: no memory figures
        self.pending: _Pending | None = None
        stack.attach(self.recorder)

    @contextlib.contextmanager
    def untimed(self, category: str):
        """Time inside a save or a load that is not part of it (its anatomy excludes the category too)."""
        start = time.perf_counter()
        try:
            with self.anatomy.region(category):
                yield
        finally:
            self.recorder.untimed += time.perf_counter() - start

    # ---- saving ---------------------------------------------------------------------------------------------------
    def save(self, step: int) -> None:
        """Checkpoint the state after `step` as tag global_step<step>: synchronous saves are committed (and their
        record emitted) before this returns; asynchronous ones at a later poll() or finish()."""
        assert self.pending is None, "finish() the previous save first"
        tag = f"global_step{step}"
        started = time.perf_counter()
        tensors = self.stack.record_digests(tag)  # the state cannot change during the save: taken just before it
        if tensors is not None:
            self.log.emit(Digest(tag, time.perf_counter() - started, tensors))
        rec = self.recorder
        rec.saved.clear()
        rec.committed.clear()
        rec.step, untimed = step, rec.untimed
        p = _Pending(tag, step, self.memory.open() if self.memory else None)
        # the anatomy window shares the save's clock: from p.start to where commit_seconds (or blocking) stops
        with self.anatomy.measure(SAVE_CATEGORIES, excluded=self.stack.untimed["save"],
                                  start=(p.wall_start, p.start)) as window:
            try:
                p.facts = self.stack.save(self.target.root, tag, step, rec, self.untimed) or {}
            except Exception as exc:
                raise self.target.explain_save_failure(exc, tag) from exc
            p.untimed = rec.untimed - untimed
            returned = time.perf_counter()
            p.blocking = returned - p.start - p.untimed
            p.saved = list(rec.saved)
            p.returned_io = self.anatomy.counters.totals()  # the flush's I/O is counted from here, with no gap
            if self.memory:
                p.returned, p.buffers = self.memory.now(), self.recorder.io.buffers()
            if not self.asynchronous:
                self._wait(p)
                self._commit(p)
            p.anatomy = window.close(end=returned if self.asynchronous else p.committed_at)
        if self.asynchronous:
            p.thread = threading.Thread(target=self._wait, args=(p,), name=f"durable-{tag}", daemon=True)
            p.thread.start()
            self.pending = p
        else:
            self._emit(p)

    def _wait(self, p: _Pending) -> None:
        """The engine's flush is done, then the target makes the files durable. In the waiter thread of an
        asynchronous save (never a collective: the main thread owns those), or inline for a synchronous one."""
        counters = self.anatomy.counters
        before, begun = p.returned_io or counters.totals(), time.perf_counter()
        try:
            with self.anatomy.region("fsync"):  # the main thread's doing only: a no-op in the waiter thread
                if self.waits_for_deepspeed:
                    self.recorder.committed.wait()  # DeepSpeed's commit in engine.step() (its decoupled writer)
                else:
                    self.recorder.io.wait()
                waited = time.perf_counter()
                # the files' data, then their folders: durable from here whether or not the engine's wait fsync'd
                self.target.make_durable([path for path, _ in p.saved])
            p.durable_at = time.perf_counter()
            p.durability = {"by": "engine" if self.engine_fsyncs else "harness fsync",
                            "engine_wait_seconds": round(waited - begun, 6),
                            "make_durable_seconds": round(p.durable_at - waited, 6)}
            io = delta(counters.totals(), before)
            p.flush = {"seconds": round(p.durable_at - begun, 6),
                       "write_busy_seconds": round(io["write"]["busy_seconds"], 6) if io else None,
                       "fsync_busy_seconds": round(io["sync"]["busy_seconds"], 6) if io else None, "io": io}
            p.engine_statistics = self.recorder.io.statistics()
        except Exception as exc:
            if p.thread is None:
                raise self.target.explain_save_failure(exc, p.tag) from exc
            p.error = exc

    def _commit(self, p: _Pending) -> None:
        """Every rank calls this once its files are durable: barrier, then rank 0 has the target commit `latest`."""
        if p.thread is not None:
            p.thread.join()
        if p.error is not None:
            raise self.target.explain_save_failure(p.error, p.tag) from p.error
        digests_written(self.stack)  # on disk before the save is committed: a restart verifies against them
        with self.anatomy.region("wait"):
            if self.stack.untimed["save"]:
                slowest = max_of(p.durable_at - p.start - p.untimed, self.stack.device)
                after = time.perf_counter()
            else:
                barrier()
        if self.stack.rank == 0:
            with self.anatomy.region("fsync"):  # files the stack writes outside the engine (DeepSpeed's scripts)
                self.target.make_durable([self.target.root / p.tag])
            self.target.commit_latest(p.tag)
        with self.anatomy.region("wait"):
            barrier()
        p.committed_at = time.perf_counter()
        p.commit_seconds = (slowest + p.committed_at - after if self.stack.untimed["save"]
                            else p.committed_at - p.start)

    def _emit(self, p: _Pending) -> None:
        if p.memory:  # closed once its anatomy window is: reading the memory counters is in no timed figure
            self.memory.close(p.memory)
        tag_dir = self.target.root / p.tag
        files = [{"path": str(Path(path).relative_to(tag_dir)), "bytes": self.target.size(path), "seconds": seconds}
                 for path, seconds in p.saved]
        checksum_seconds = None
        if self.checksums:  # committed: the files are what a restart will read; outside every timed figure
            start = time.perf_counter()
            for f, (path, _) in zip(files, p.saved, strict=True):
                f[checksum.ALGORITHM] = checksum.of(path)
            checksum_seconds = time.perf_counter() - start
            if p.saved:
                faults.hit("commit", self.stack.rank, p.step, where=max((path for path, _ in p.saved),
                                                                        key=self.target.size))
        self.log.emit(Save(
            tag=p.tag, step=p.step, start=p.wall_start, blocking_seconds=p.blocking,
            durable_seconds=p.durable_at - p.start - p.untimed, commit_seconds=p.commit_seconds,
            files=files, bytes=sum(f["bytes"] for f in files), asynchronous=self.asynchronous,
            in_flight_steps=p.in_flight_steps, anatomy=p.anatomy, flush=p.flush if self.asynchronous else None,
            engine_statistics=p.engine_statistics, checksum_seconds=checksum_seconds, extra=p.facts,
            memory=_memory(p), durability=p.durability))

    def overlapped(self, step_start: float) -> bool:
        """Was a flush in flight at any time since step_start (perf_counter)? Counts the step for the save."""
        p = self.pending
        hit = p is not None and (p.durable_at is None or p.durable_at > step_start)
        if hit:
            p.in_flight_steps += 1
        return hit

    def poll(self) -> None:
        """At a step boundary: commit the pending save if every rank is durable (one all-reduce)."""
        if self.pending is None:
            return
        done = self.pending.durable_at is not None or self.pending.error is not None
        if all_true(done, self.stack.device):
            self._finish_pending()

    def finish(self) -> None:
        """Before the next save and at the end of the phase: wait for the flush on every rank, then commit."""
        if self.pending is None:
            return
        if self.waits_for_deepspeed and not self.recorder.committed.is_set():
            self.stack.commit_pending()  # no training step since the save: commit it now, as that step would
        self._finish_pending()

    def _finish_pending(self) -> None:
        p, self.pending = self.pending, None
        self._commit(p)
        self._emit(p)

    # ---- loading --------------------------------------------------------------------------------------------------
    def load(self, tag: str | None = None) -> tuple[str, dict]:
        """The restart's checkpoint_load phase: the stack's load of `tag` (else the one `latest` names; none is an
        error) inside the anatomy window, whose start and end the phase's marks carry, opened after one barrier (the
        wait for the slowest rank is engine_init's); returns the tag and the client state saved with it."""
        engine_init = self.log.phase_fields()  # memory and I/O of engine_init, read before the load's barrier
        barrier()  # every rank starts the load clock together: one rank's slower start is not load time
        load_start, untimed = time.time(), self.recorder.untimed  # anatomy=false: the mark's time (else engine_init's)
        with self.anatomy.measure(LOAD_CATEGORIES, excluded=self.stack.untimed["load"]) as window:
            tag = tag or self.target.latest()
            if tag is None:
                raise FileNotFoundError(f"no 'latest' in {self.target.target.describe()}: nothing committed to restart from")
            client_state = self.stack.load(self.target.root, tag, self.recorder, self.untimed)
            sync(self.stack.device)
            breakdown = window.close()
        load_end = time.time()
        self.log.mark("engine_initialized", t=breakdown["start"] if breakdown else load_start,
                      fields=engine_init)
        self.log.mark("checkpoint_loaded", t=breakdown["end"] if breakdown else None)
        self.log.emit(Loaded(tag, [{"path": p, "seconds": s} for p, s in self.recorder.loaded], load_start, load_end,
                             self.recorder.io.load_statistics(), round(self.recorder.untimed - untimed, 6)))
        if breakdown:
            self.log.emit(LoadAnatomy(breakdown))
        return tag, client_state


def _memory(p: _Pending) -> dict | None:
    """The save's memory against the resident set at its start (each figure: docs/measurements.md#memory-per-save)."""
    w = p.memory
    if w is None or w.start_rss is None:
        return None
    out = {"rss_before_bytes": w.start_rss, "peak_added_bytes": added(w.peak_rss, w.start_rss),
           "held_bytes": added(p.returned[0], w.start_rss), "retained_bytes": added(w.end_rss, w.start_rss),
           "engine_buffers": p.buffers}
    if w.start_device is not None:
        out["device"] = {"allocated_before_bytes": w.start_device,
                         "peak_added_bytes": added(w.peak_device, w.start_device),
                         "held_bytes": added(p.returned[1], w.start_device),
                         "retained_bytes": added(w.end_device, w.start_device)}
    return out
