"""Saves whose engine flushes in the background: blocking, durable and committed measured apart, with training
going on in between. Sync engines go straight through checkpointing.save (today's behaviour and figures).

Per save and rank:
  blocking_seconds  inside engine.save_checkpoint() (what training waits for)
  durable_seconds   until this rank's waiter thread has seen the engine's flush finish (plugin wait_durable, or
                    DeepSpeed's commit for its decoupled engines) AND has fsync'd every file and directory
  commit_seconds    until `latest` names the tag: committed only when all ranks are durable (see poll / finish)
Each step records whether a flush was in flight during it, so the summary can show what the overlap costs.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from restart_harness.iocount import delta
from restart_harness.storage.atomic import files_under, fsync_paths
from restart_harness.worker import checkpointing
from restart_harness.worker.anatomy import SAVE_CATEGORIES


class _Pending:
    """One async save in flight on this rank; its waiter thread stamps durable_at (perf_counter)."""

    def __init__(self, tag: str, step: int, wall_start: float, start: float, blocking: float, saved: list):
        self.tag, self.step, self.wall_start, self.start, self.blocking = tag, step, wall_start, start, blocking
        self.saved = saved
        self.anatomy: dict | None = None  # the blocking part's breakdown (worker/anatomy.py)
        self.flush: dict | None = None  # the background part: seconds, and write/fsync busy seconds in it
        self.durable_at: float | None = None
        self.error: Exception | None = None
        self.in_flight_steps = 0
        self.thread: threading.Thread | None = None


class Saver:
    """Drives checkpointing for one rank: sync engines as before; async ones with a waiter thread and a deferred
    commit of `latest`. all_true(flag) is a collective returning True when flag is True on every rank."""

    def __init__(self, ds_engine, recorder, plugin, ckpt_root: Path, rank: int, barrier, all_true):
        self.ds_engine, self.recorder, self.plugin = ds_engine, recorder, plugin
        self.ckpt_root, self.rank, self.barrier, self.all_true = ckpt_root, rank, barrier, all_true
        self.decoupled = bool(recorder.inner.is_decoupled())  # DeepSpeed commits it in the next engine.step()
        self.asynchronous = self.decoupled or plugin.is_async()
        self.pending: _Pending | None = None

    def save(self, tag: str, step: int) -> dict | None:
        """Start a save; the save record when already committed (sync engines), else None (see poll, finish)."""
        client_state = checkpointing.client_state(self.plugin.spec, step)
        if not self.asynchronous:
            record = checkpointing.save(self.ds_engine, self.recorder, self.plugin, self.ckpt_root, tag, client_state,
                                        self.rank, self.barrier)
            return {**record, "step": step, "async": False, "in_flight_steps": 0}
        assert self.pending is None, "finish() the previous save first"
        rec = self.recorder
        rec.saved.clear()
        rec.committed.clear()
        rec.step = step
        wall_start, start = time.time(), time.perf_counter()
        with rec.anatomy.measure(SAVE_CATEGORIES) as window:
            try:
                self.ds_engine.save_checkpoint(str(self.ckpt_root), tag=tag, client_state=client_state,
                                               save_latest=False)
            except Exception as exc:
                raise checkpointing._explain_save_failure(exc, self.ckpt_root, tag) from exc
            blocking_record = window.close()
        pending = _Pending(tag, step, wall_start, start, time.perf_counter() - start, list(rec.saved))
        pending.anatomy = blocking_record
        pending.thread = threading.Thread(target=self._wait, args=(pending,), name=f"durable-{tag}", daemon=True)
        pending.thread.start()
        self.pending = pending
        return None

    def _wait(self, pending: _Pending) -> None:
        """Waiter thread: engine flush finished, then fsync; never a collective (the main thread owns those)."""
        counters = self.recorder.anatomy.counters
        before, begun = counters.totals(), time.perf_counter()
        try:
            if self.decoupled and not self._waits_itself():
                self.recorder.committed.wait()  # DeepSpeed's commit in engine.step() (its decoupled writer)
            else:
                self.plugin.wait_durable(self.recorder.inner)  # the engine's own flush (torchsnapshot, dcp, ...)
            files = [f for path, _ in pending.saved for f in files_under(Path(path))]
            fsync_paths(files)
            pending.durable_at = time.perf_counter()
            io = delta(counters.totals(), before)
            pending.flush = {"seconds": round(pending.durable_at - begun, 6),
                             "write_busy_seconds": round(io["write"]["busy_seconds"], 6) if io else None,
                             "fsync_busy_seconds": round(io["sync"]["busy_seconds"], 6) if io else None,
                             "io": io}
            stats = getattr(self.recorder.inner, "flush_stats", None)  # the engine's own account, where it keeps one
            if stats is not None:
                pending.flush["engine"] = stats()
        except Exception as exc:  # noqa: BLE001 - any failure is re-raised in the main thread by _commit
            pending.error = exc

    def overlapped(self, step_start: float) -> bool:
        """Was a flush in flight at any time since step_start (perf_counter)? Counts the step for the save."""
        p = self.pending
        hit = p is not None and (p.durable_at is None or p.durable_at > step_start)
        if hit:
            p.in_flight_steps += 1
        return hit

    def poll(self) -> dict | None:
        """At a step boundary: commit if every rank is durable (one all-reduce); the save record if committed."""
        if self.pending is None:
            return None
        done = self.pending.durable_at is not None or self.pending.error is not None
        if not self.all_true(done):
            return None
        return self._commit()

    def finish(self) -> dict | None:
        """Before the next save and at the end of the phase: wait for the flush on every rank, then commit."""
        if self.pending is None:
            return None
        if self.decoupled and not self._waits_itself() and not self.recorder.committed.is_set():
            # No engine.step() since the save: let DeepSpeed commit now, as its step() would (all ranks call it).
            self.ds_engine._commit_decoupled_checkpoint()
        self.pending.thread.join()
        return self._commit()

    def _waits_itself(self) -> bool:
        """The plug-in knows when its flush is done (it overrides wait_durable); else DeepSpeed's commit says so."""
        from engines.base import Engine

        return type(self.plugin).wait_durable is not Engine.wait_durable

    def _commit(self) -> dict:
        p, self.pending = self.pending, None
        p.thread.join()
        if p.error is not None:
            raise checkpointing._explain_save_failure(p.error, self.ckpt_root, p.tag) from p.error
        checkpointing.commit_latest(self.ckpt_root, p.tag, self.rank, self.barrier, self.recorder.anatomy,
                                    self.plugin.store)
        committed = time.perf_counter() - p.start
        files = checkpointing.file_records(p.saved, self.ckpt_root / p.tag, self.plugin.store)
        return {
            "tag": p.tag,
            "step": p.step,
            "start": p.wall_start,
            "blocking_seconds": p.blocking,
            "durable_seconds": p.durable_at - p.start,
            "commit_seconds": committed,
            "files": files,
            "bytes": sum(f["bytes"] for f in files),
            "async": True,
            "in_flight_steps": p.in_flight_steps,
            "anatomy": p.anatomy,
            "flush": p.flush,
            "universal_info": True,
        }
