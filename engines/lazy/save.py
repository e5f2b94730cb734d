"""engine=lazy's CheckpointIO (LazyIO: its saves, its loads (load.py) and the DeepSpeed internals it patches, each
named where it is patched) and its save pipeline: save() plans where every tensor goes and returns; a copy thread
copies the tensors into kept host buffers while the next step runs (on CUDA, on a side stream), handing each write
request to the writers once it has passed it; the next optimizer step waits only for copies not yet done."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist

from engines.base import CheckpointIO
from engines.lazy import MIB, REPLICATED, Options
from engines.lazy.buffers import aligned
from engines.lazy.format import HEADER, REMAINDER, part_name, plan, split
from engines.lazy.load import Loader
from engines.lazy.policy import STAGING_RECORDS, SaveStats, Staging
from engines.lazy.staging import Flush, Part, Writers, write_small


class Saver:
    """A rank's saves: their copies, their writes, and the buffers kept for the next save of the same layout."""

    def __init__(self, options: Options, storage: dict | None, ds_engine, dp_rank: int, dp_size: int):
        self.options, self.ds_engine, self.dp_rank, self.dp_size = options, ds_engine, dp_rank, dp_size
        self.stats = SaveStats()
        self.writers = Writers(options.writers, self.stats)
        self.copier = ThreadPoolExecutor(1, thread_name_prefix="lazy-copy")
        self.staging = Staging(options, storage)
        self.plans: dict[tuple, Part] = {}  # (file name, layout signature) -> reusable part
        self.copies: list = []  # futures of copies not yet waited for by an optimizer step
        self.writes: list = []  # futures of writes not yet waited for by wait()
        self.side_stream = None
        self.lock = threading.Lock()

    def save(self, state, path: str) -> list[str]:
        tensors, remainder = split(state)
        replicated = bool(REPLICATED.search(path)) and self.options.balance and self.dp_size > 1
        total = sum(t.numel() * t.element_size() for t in tensors)
        shares = self.dp_size if replicated and total >= self.dp_size * self.options.balance_min_mib * 2**20 else 1
        if replicated and shares == 1 and self.dp_rank != 0:
            return []  # replica 0 writes this (small) file whole, as DeepSpeed would
        mine = self.dp_rank if shares > 1 else 0
        header, placements = plan(tensors, shares)
        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        written: list[str] = []
        if mine == 0:  # the header and the remainder: small, written and fsync'd by the pool too
            small = [(d / REMAINDER, remainder), (d / HEADER, json.dumps(header).encode())]
            with self.lock:
                self.writes += [self.writers.pool.submit(write_small, p, data) for p, data in small]
            written += [str(p) for p, _ in small]
        part = self._part(d, mine, header["parts"][mine]["bytes"], tensors, placements)
        written.append(str(part.path))
        flush = Flush(part, getattr(self.ds_engine, "global_steps", None), self.options.direct_io,
                       self.options.write_chunk_mib * MIB, self.writers)
        event, cuda = None, any(t.is_cuda for t in tensors)
        if cuda and self.side_stream is None:  # here, on the rank's device (the copy thread's current device is 0)
            self.side_stream = torch.cuda.Stream()
        if cuda and not part.ring:
            marks = self._copy_on_side_stream(part, tensors, flush.chunk)
            copy = self.copier.submit(self._after_events, flush, marks)
            event = marks[-1][0] if marks else None
        elif cuda:  # a ring's copies wait for slots: queued by the copy thread
            made = torch.cuda.Event()
            made.record()
            copy = self.copier.submit(self._copy, flush, tensors, made)
        else:
            copy = self.copier.submit(self._copy, flush, tensors)
        with self.lock:
            self.copies.append((copy, event))
            self.writes.append(flush.done)
        return written

    def _part(self, d: Path, k: int, size: int, tensors, placements) -> Part:
        signature = (d.name, k, size, tuple((str(t.dtype), tuple(t.shape), t.device.type) for t in tensors))
        part = self.plans.get(signature)
        if part is not None and not part.busy:
            self.stats.buffers_reused += 1
        else:
            pinned = torch.cuda.is_available() and any(t.is_cuda for t in tensors)
            copies = [(i, off, n) for i, (p, off, n) in enumerate(placements) if p == k]
            chunk = self.options.write_chunk_mib * MIB
            slots, why = self.staging.choose(d, aligned(size), chunk, pinned)
            part = Part(d / part_name(k), size, pinned, copies, chunk, slots)
            self.plans[signature] = part
            self.stats.buffers_allocated += 1
            if len(self.stats.staging) < STAGING_RECORDS:
                self.stats.staging.append({"file": d.name, "part_bytes": size, "buffer_bytes": part.nbytes, "why": why})
        part.path = d / part_name(k)
        part.busy = True
        return part

    def _copy(self, flush: Flush, tensors, after=None) -> None:
        """The tensors into the part's buffer in offset order, at most a request's bytes at a time, each request's
        slot taken first in a ring; after: a CUDA event the copies on the side stream wait for (a ring's)."""
        start = time.perf_counter()
        part, chunk = flush.part, flush.chunk
        try:
            if after is not None:  # the side stream, made by save() on the rank's device, which entering it makes current
                self.side_stream.wait_event(after)
            with torch.cuda.stream(self.side_stream) if after is not None else contextlib.nullcontext():
                copies = part.copies
                for j, (i, off, n) in enumerate(copies):
                    t = tensors[i]
                    nxt = copies[j + 1][1] if j + 1 < len(copies) else flush.length
                    first, last = off // chunk, (off + max(n, 1) - 1) // chunk
                    if first == last or not (part.ring or t.is_contiguous()):  # in one request, or whole
                        if not flush.claim_upto(last):
                            break
                        part.staged(off, n).view(t.dtype).view(t.shape).copy_(t)
                        flush.ready(nxt)
                        continue
                    src = t.contiguous().reshape(-1).view(torch.uint8)
                    pos = off
                    while pos < off + n:
                        end = min((pos // chunk + 1) * chunk, off + n)
                        if not flush.claim_upto(pos // chunk):
                            break
                        part.staged(pos, end - pos).copy_(src[pos - off:end - off])
                        pos = end
                        flush.ready(end if end < off + n else nxt)
                    if pos < off + n:
                        break
                else:
                    if flush.claim_upto(len(flush.offsets) - 1):
                        flush.ready()
            if flush.error is not None:  # a write failed: the requests left count down unwritten
                flush.failed(flush.error)
        except BaseException as exc:
            flush.failed(exc)
            raise
        finally:
            self.stats.add("copy_seconds", time.perf_counter() - start - flush.waited)  # copying, not waiting for slots
            self.stats.add("staging_wait_seconds", flush.waited)

    def _copy_on_side_stream(self, part: Part, tensors, chunk: int) -> list:
        """The device->host copies queued on a side stream, an event after every request's worth of bytes."""
        self.side_stream.wait_stream(torch.cuda.current_stream())
        marks, since = [], 0
        with torch.cuda.stream(self.side_stream):
            for j, (i, off, n) in enumerate(part.copies):
                t = tensors[i]
                part.buffer[off:off + n].view(t.dtype).view(t.shape).copy_(t, non_blocking=True)
                if t.is_cuda:  # a CPU tensor (an optimizer's step count) is copied before copy_ returns
                    t.record_stream(self.side_stream)
                since += n
                if since >= chunk or j == len(part.copies) - 1:
                    # blocking: the copy thread sleeps on it instead of spinning a core beside the training step
                    event = torch.cuda.Event(blocking=True)
                    event.record(self.side_stream)
                    marks.append((event, part.copies[j + 1][1] if j + 1 < len(part.copies) else None))
                    since = 0
        return marks

    def _after_events(self, flush: Flush, marks: list) -> None:
        start = time.perf_counter()
        try:
            for event, upto in marks:
                event.synchronize()
                flush.ready(upto)
            flush.ready()
        except BaseException as exc:
            flush.failed(exc)
            raise
        finally:
            self.stats.add("copy_seconds", time.perf_counter() - start)

    def wait_copied(self) -> None:
        """Before an optimizer step: the copies of every save so far are done (on CUDA: the step's stream waits for
        them on the GPU)."""
        with self.lock:
            copies, self.copies = self.copies, []
        if not copies:
            return
        start = time.perf_counter()
        for copy, event in copies:
            if event is not None:  # queued on the side stream at save(): the step's stream waits on the GPU
                torch.cuda.current_stream().wait_event(event)
            else:
                copy.result()
        self.stats.add("step_wait_seconds", time.perf_counter() - start)

    def wait(self) -> None:
        """Every save so far is written and fsync'd (its copies too)."""
        with self.lock:
            writes, self.writes = self.writes, []
        for w in writes:
            w.result()

    def buffers(self) -> dict:
        """Every part's staging buffer, kept for the next save of the same layout."""
        parts = list(self.plans.values())
        return {"host_bytes": sum(p.nbytes for p in parts),
                "pinned_bytes": sum(p.nbytes for p in parts if p.buffer.is_pinned())}

    def statistics(self) -> dict:
        """The saves since the last call; staging_bytes: the parts kept for later saves (policy.SaveStats)."""
        return self.stats.take(list(self.plans.values()))


class LazyIO(CheckpointIO):
    def __init__(self, options: Options, ds_engine, storage: dict | None = None):
        """ds_engine: DeepSpeed's engine (None: the format alone, as in tests: no step to wait in); storage: the
        run's storage probe (files/baseline.py), which the policies go by."""
        self.options, self.ds_engine = options, ds_engine
        # this rank's data-parallel index, the group's size, the group (DeepSpeed's optimizer's; None alone)
        group = getattr(getattr(ds_engine, "optimizer", None), "dp_process_group", None)
        alone = group is None or not dist.is_initialized()
        data_parallel = (0, 1, group) if alone else (dist.get_rank(group=group), dist.get_world_size(group=group), group)
        self.dp_rank, self.dp_size, self.dp_group = data_parallel
        self.saver = Saver(options, storage, ds_engine, self.dp_rank, self.dp_size)
        self.loader = Loader(options, storage, ds_engine, data_parallel)
        # the save's (statistics: since the last call, policy.SaveStats) and the load's, as they are
        self.wait_copied, self.wait, self.buffers = self.saver.wait_copied, self.saver.wait, self.saver.buffers
        self.statistics, self.load_statistics = self.saver.statistics, self.loader.statistics
        if ds_engine is not None:
            self.patch_deepspeed(ds_engine)

    def patch_deepspeed(self, ds_engine) -> None:
        """DeepSpeed's engine, patched: save_non_zero_checkpoint (every replica writes its share of the replicated
        files), and _take_model_step, wrapped (the step waits for the copies; until the first save, marks its time)."""
        if self.options.balance and self.dp_size > 1:
            ds_engine.save_non_zero_checkpoint = True
        step = ds_engine._take_model_step

        def take_model_step(*args, **kwargs):
            if not self.saver.plans:  # the optimizer step's interval, until the first save
                self.saver.staging.mark_step()
            self.saver.wait_copied()  # nothing may change the state while it is being copied
            return step(*args, **kwargs)

        ds_engine._take_model_step = take_model_step

    def save(self, state, path):
        self.loader.last_read.clear()
        return self.saver.save(state, path)

    def load(self, path, map_location=None, into=None):
        return self.loader.load(path, map_location)

    def preserves_storage_sharing(self):
        return False  # each view's own elements are copied: no defensive clone needed

    def is_data_parallel_writer(self, dp_rank):
        return dp_rank == 0 or (self.options.balance and self.dp_size > 1)
