"""engine=lazy: the harness's own engine, built to show how close to the storage a checkpoint can get.

Save (DeepSpeed's save_checkpoint drives it, file by file):
  1. save() takes references, not copies: it pickles the non-tensor remainder (small), plans where every tensor goes
     (engines/_lazy_format.py: raw bytes at aligned offsets in one part file per writer) and returns.
  2. a copy thread copies the tensors into host buffers while the next forward and backward run, a write request's
     worth at a time; the next optimizer step (DeepSpeed's _take_model_step, wrapped) waits only for copies not yet
     done. On CUDA the copies run device->host into page-locked buffers on a side stream, and the step waits on the
     copy's event on the GPU, not on the host. Buffers and the write plan are kept per file name and layout and
     reused by every later save; a buffer is at most its part's bytes (page-locked by registering it, not through
     torch's pinned allocator, which rounds up to a power of two): the whole part, or (staging_mib, _staging) a ring
     of write requests that the copy reuses once their writes are done.
  3. `writers` threads write each part from its buffer in requests of write_chunk_mib (O_DIRECT by default), each
     request as soon as the copy has passed it: the storage sees the queue depth and request size the storage
     ceiling is probed with (files/baseline.py), overlapping the copy. Then fsync; the harness fsyncs the
     directories and commits `latest` once every rank is done.
  4. a file replicated over data-parallel ranks (a pp=1 run's model weights, which DeepSpeed has replica 0 write
     alone) is written by all replicas in balanced shares (parts of the same directory); pipeline layer files are
     spread over replicas by DeepSpeed's own checkpoint.parallel_write.pipeline_stage.
Load: every part read into one preallocated buffer by `readers` threads in parallel requests, tensors built as views
of it (no copy); the rank's own ZeRO file is read ahead while DeepSpeed takes in the model file. A replicated file
is read once by the data-parallel group and broadcast, or read by every replica, whichever the measured bandwidths
say is sooner (replicated_way(); broadcast_load=auto).

Format, reader, converter to DeepSpeed's torch.save layout: engines/_lazy_format.py.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engines.base import CheckpointIO, Engine, EngineContext, FileLayout
from restart_harness import faults
from restart_harness.files.baseline import CEILING_QUEUE_DEPTH, CEILING_REQUEST_BYTES
from restart_harness.spec.keys import key

# the files DeepSpeed has data-parallel replica 0 write (not ZeRO-3's zero_pp_rank_N_mp_rank_NN_model_states.pt: a
# data-parallel rank's own)
REPLICATED = re.compile(r"(?:^|/)mp_rank_\d+_model_states\.pt$")
MIB = 1 << 20
# the broadcast's bandwidth is measured with one broadcast of this many bytes (or the file's share, if smaller)
BROADCAST_PROBE_BYTES = 8 * MIB
# parts whose staging (bytes, buffer, why) every save's engine_statistics lists; all of them are in staging_bytes
STAGING_RECORDS = 16


@dataclass
class Options:
    # the defaults are the storage ceiling's shape (files/baseline.py): its queue depth and request size
    writers: int = key(CEILING_QUEUE_DEPTH, "writer threads per rank: write requests in flight", group="checkpoint",
                       minimum=1, maximum=256)
    readers: int = key(CEILING_QUEUE_DEPTH, "reader threads per rank at restart: read requests in flight",
                       group="checkpoint", minimum=1, maximum=256, restart=True)
    write_chunk_mib: int = key(CEILING_REQUEST_BYTES // MIB, "bytes per write request", group="checkpoint",
                               unit="MiB", minimum=1)
    # auto since 2026-11-27: a part need not be staged whole when its writes catch up with its copy before the next
    # optimizer step waits for it (docs/engines.md, "Staging"); on CUDA auto stages whole parts
    staging_mib: int = key(0, "host staging buffer of each part file a rank writes: a ring of write requests that "
                              "the copy reuses once their writes are done (at least writers + 1 requests); 0 (auto): "
                              "the part less what the writers are expected to write within half the optimizer step's "
                              "interval, by the storage probe's write ceiling and the interval measured before the "
                              "first save (the whole part on CUDA, without a probe or without two steps before it)",
                           group="checkpoint", unit="MiB", minimum=0)
    balance: bool = key(True, "replicated model files written by all data-parallel replicas in balanced shares "
                              "(false: by replica 0, as DeepSpeed does)", group="checkpoint")
    balance_min_mib: int = key(4, "split a replicated file only when each share gets at least this much",
                               group="checkpoint", unit="MiB", minimum=0)
    # the default since 2026-11-25: on this project's disk O_DIRECT made a small dp=2 save durable 4.9x sooner and its
    # restart load 1.5x faster than buffered I/O (docs/benchmarks.md#lazy-at-the-storage-limit)
    direct_io: bool = key(True, "write the part files with O_DIRECT (aligned buffers and requests, no page cache; "
                                "false: buffered), and read them so where read_io=auto has no storage probe to go by; "
                                "where the file system refuses it, buffered I/O, recorded as direct_io_fallback in the "
                                "save's engine_statistics", group="checkpoint")
    # auto since 2026-11-27: which way reads faster differs from disk to disk and from day to day (on this project's
    # disk fio's buffered read beat its O_DIRECT one, 1.27-1.38 GB/s against 0.75-0.92, while this engine's own
    # O_DIRECT threads read 1.42 GB/s against 1.02 buffered: docs/benchmarks.md#fresh-pages-faulted-in-ahead-of-the-
    # reads), so the run's own probe decides
    read_io: str = key("auto", "at restart, read the part files with O_DIRECT (direct), through the page cache "
                               "(buffered), or the way the run's storage probe read faster in this engine's shape "
                               "(auto: its O_DIRECT and its buffered read; without a probe, direct_io's way)",
                       group="checkpoint", choices=("auto", "direct", "buffered"), restart=True)
    broadcast_load: str = key("auto", "at restart, a replicated model file is read once per data-parallel group (each "
                                      "part by one replica) and broadcast to the other replicas (true), read by "
                                      "every replica (false), or whichever is sooner by the broadcast's bandwidth "
                                      "measured over the group and the storage's read bandwidth per reader from its "
                                      "probe (auto; replicas on one node reading buffered share its page cache: "
                                      "every replica reads)", group="checkpoint", choices=("auto", "true", "false"),
                              restart=True)


class LazyFiles(FileLayout):
    """DeepSpeed's files; with broadcast_load a replicated model file is read once per data-parallel group."""

    def restart_read_bytes(self, path: str, nbytes: int, dp_rank: int) -> int:
        """With broadcast_load (auto planned as the broadcast: the restart decides), a replicated model file is read
        once per data-parallel group: in shares (part k by replica k) where it was written in shares, else by
        replica 0 (LazyIO._broadcast_parts)."""
        dp, o = self.spec.dp, self.options
        if not (o.broadcast_load != "false" and dp > 1 and REPLICATED.search(path)):
            return nbytes
        if o.balance and nbytes >= dp * o.balance_min_mib * 2**20:
            return nbytes // dp + (nbytes % dp if dp_rank == 0 else 0)
        return nbytes if dp_rank == 0 else 0


class LazyEngine(Engine):
    name = "lazy"
    description = ("the harness's own: lazy copy overlapping the next step, aligned writes following the copy at the "
                   "storage ceiling's queue depth from buffers no larger than the writes need, balanced replica "
                   "writes, parallel reads and read-ahead into preallocated buffers, a replicated file broadcast or "
                   "read by every replica as measured (engines/_lazy_format.py)")
    Options = Options
    emulates = False  # needs the DeepSpeed engine to hook its optimizer step
    file_layout = LazyFiles
    durable_on_wait = True  # its writers fsync each part file before wait() returns
    fault_point = "flush"  # its files are written by its own flush, not through the recorder

    def asynchronous(self) -> bool:
        return True

    def ds_config(self) -> dict:
        return {"checkpoint": {"parallel_write": {"pipeline_stage": True}}} if self.spec.pp > 1 else {}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return LazyIO(self.options, ctx.training, storage=ctx.storage)


def replicated_way(file_bytes: int, replicas: int, broadcast_mib_s: float | None,
                   read_mib_s_per_reader: float | None) -> dict:
    """Once every replica has read its own share of a replicated file (both ways read it): broadcast the shares over
    the data-parallel group, or have every replica read the others' shares too, whichever is sooner (seconds; F the
    file, d the replicas, r the storage's read bandwidth per reader, B the broadcast's bandwidth):
      every replica reads the other shares:  F (d-1)/d / r
      broadcast every share in turn:         F / B
    so the broadcast when B > r d/(d-1). The rank's own ZeRO file is read meanwhile either way; the model does not
    count on the broadcast hiding behind those reads (on 2 busy cores it did not: gloo's copies and the reads' page
    faults share the CPUs). Without r or B (no probe, shares too small to time) the broadcast, which reads the fewest
    bytes."""
    if not read_mib_s_per_reader or not broadcast_mib_s:
        return {"way": "broadcast", "why": "no storage read bandwidth (no probe: baseline=false, or it failed, and "
                                           "the shares too small to time): the broadcast, which reads the fewest "
                                           "bytes"}
    f, d = file_bytes / MIB, replicas
    r, b = read_mib_s_per_reader, broadcast_mib_s
    read_s = f * (d - 1) / d / r
    broadcast_s = f / b
    way = "broadcast" if broadcast_s < read_s else "read"
    why = (f"{'broadcast' if way == 'broadcast' else 'every replica reads'}: {min(read_s, broadcast_s):.3f} s "
           f"against {max(read_s, broadcast_s):.3f} s for the other replicas' shares (broadcast {b:,.0f} MiB/s over "
           f"the data-parallel group, storage {r:,.0f} MiB/s a reader, {f:,.1f} MiB over {d} replicas)")
    return {"way": way, "why": why, "predicted_broadcast_seconds": round(broadcast_s, 6),
            "predicted_read_seconds": round(read_s, 6), "broadcast_mib_s": round(b, 1),
            "read_mib_s_per_reader": round(r, 1)}


class _Part:
    """One part file this rank writes: its buffer, and which tensors go where in it. The buffer starts at an
    ALIGNMENT boundary and is zeroed once (the gaps between aligned tensors and the padding after the last are
    written as zeros), so an O_DIRECT write can take it whole.

    The buffer holds the whole part, or (staging_mib) a ring of `slots` write requests: request c of the part is
    staged in slot c % slots, and the copy takes a slot only once the write of the request before it there is done
    (_Flush.claim_upto). A request put in a slot that last held another one has its gaps zeroed first, so the file
    gets the same bytes either way."""

    def __init__(self, path: Path, size: int, pinned: bool, copies: list[tuple[int, int, int]], chunk: int,
                 slots: int | None = None):
        from engines import _lazy_format as fmt

        self.path, self.size, self.chunk = path, size, chunk
        self.copies = copies  # (tensor index, offset, nbytes), by offset
        self.chunks = max(1, -(-fmt.aligned(size) // chunk))  # write requests of the part
        self.slots = min(slots or self.chunks, self.chunks)
        self.ring = self.slots < self.chunks
        self.nbytes = self.slots * chunk if self.ring else size  # the buffer's bytes (its padding aside)
        self.buffer = fmt.aligned_empty(self.nbytes, pinned=pinned, zeroed=True)
        self.holds: list = [None] * self.slots  # the request each slot holds the bytes of (None: zeros)
        self.gaps = _gaps(copies, fmt.aligned(size), chunk) if self.ring else {}
        self.busy = False

    def staged(self, pos: int, n: int):
        """The buffer's n bytes staging the part's bytes from `pos` (within one request when it is a ring)."""
        if not self.ring:
            return self.buffer[pos:pos + n]
        c = pos // self.chunk
        at = c % self.slots * self.chunk + pos - c * self.chunk
        return self.buffer[at:at + n]


def _gaps(copies: list[tuple[int, int, int]], length: int, chunk: int) -> dict[int, list[tuple[int, int]]]:
    """Per write request, the byte ranges of the part that no tensor covers (alignment gaps, the end's padding)."""
    out: dict[int, list[tuple[int, int]]] = {}
    pos = 0
    for a, b in [*((off, off + n) for _, off, n in copies), (length, length)]:
        while pos < a:  # a gap from pos to a, cut at request boundaries
            end = min(a, (pos // chunk + 1) * chunk)
            out.setdefault(pos // chunk, []).append((pos, end))
            pos = end
        pos = max(pos, b)
    return out


class _Flush:
    """One part's save in flight: the copy fills its buffer in offset order, and the copy thread hands each write
    request to the writers the moment the copy has passed the request's end (ready()): no thread waits on another,
    so the training step beside it is interrupted only by requests that have work. The last request to finish
    truncates the padding away, fsyncs and closes the file and completes `done`. A ring buffer (_Part) is the one
    exception: the copy waits to take a slot until the request staged there before is written (claim_upto)."""

    def __init__(self, part: _Part, step: int | None, direct: bool, chunk: int, submit):
        from engines import _lazy_format as fmt

        self.part, self.step, self.direct = part, step, direct
        self.view = fmt.padded_view(part.buffer) if direct else fmt.byte_view(part.buffer)
        self.length = fmt.aligned(part.size) if direct else part.size
        self.offsets = list(range(0, self.length, chunk)) or [0]
        self.chunk, self.submit = chunk, submit
        self.handed = 0  # requests handed to the writers so far, in offset order
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.left = len(self.offsets)
        self.fds: list[int] = []  # every descriptor opened (closed at the end, never while a request may use one)
        self.fd: int | None = None
        self.fallback: str | None = None
        self.started: float | None = None
        self.done: Future = Future()
        # a ring: the requests the copy has taken slots for, and per slot the last request written from it
        self.claimed = -1 if part.ring else len(self.offsets) - 1
        self.written = [-1] * part.slots
        self.freed = threading.Condition()
        self.waited = 0.0  # seconds the copy waited for a slot

    def data(self, off: int, end: int) -> memoryview:
        """The staged bytes of the request [off, end)."""
        if not self.part.ring:
            return self.view[off:end]
        at = off // self.chunk % self.part.slots * self.chunk
        return self.view[at:at + end - off]

    def claim_upto(self, c: int) -> bool:
        """A ring: take the slots of every request up to c (the last request at most), each once the request staged
        there before is written, zeroing its gaps where the slot held another request. False: a write failed, the
        copy stops (wait() raises it, not the training step)."""
        part = self.part
        c = min(c, len(self.offsets) - 1)
        while self.claimed < c:
            k = self.claimed + 1
            slot = k % part.slots
            if k >= part.slots:
                before = k - part.slots  # the request staged in this slot before k
                with self.freed:
                    if self.written[slot] < before:
                        start = time.perf_counter()
                        self.freed.wait_for(functools.partial(self._free, slot, before))
                        self.waited += time.perf_counter() - start
            if self.error is not None:
                return False
            if part.holds[slot] not in (None, k):
                for a, b in part.gaps.get(k, ()):
                    part.staged(a, b - a).zero_()
            part.holds[slot] = k
            self.claimed = k
        return self.error is None

    def _free(self, slot: int, before: int) -> bool:
        return self.written[slot] >= before or self.error is not None

    def release(self, off: int) -> None:
        """Request at `off` written (or given up): its slot may take the next request."""
        if self.part.ring:
            c = off // self.chunk
            with self.freed:
                self.written[c % self.part.slots] = c
                self.freed.notify_all()

    def ready(self, upto: int | None = None) -> None:
        """Every byte before `upto` (None: all of them) is final: hand out the requests that end there or before
        (in a ring, of those the copy has taken slots for)."""
        upto = self.length if upto is None else upto
        last = min(len(self.offsets), self.claimed + 1)
        while self.handed < last and min(self.offsets[self.handed] + self.chunk, self.length) <= upto:
            self.submit(self, self.offsets[self.handed])
            self.handed += 1

    def failed(self, error: BaseException) -> None:
        """The copy failed: every request left is handed out to count down, none writes, `done` gets the error."""
        with self.lock:
            self.error = self.error or error
        self.claimed = len(self.offsets) - 1  # the requests left only count down, none is written
        self.ready()

    def descriptor(self, refused: str | None = None) -> int:
        """The file, opened once (O_DIRECT unless the file system refuses it: then a buffered descriptor beside it,
        for every request from then on; `refused`: why, when a request was refused)."""
        with self.lock:
            if refused and self.direct:
                self.direct, self.fd, self.fallback = False, None, refused
            if self.fd is None:
                flags = os.O_WRONLY | os.O_CREAT | (0 if self.fds else os.O_TRUNC)
                if self.direct:
                    try:
                        self.fd = os.open(self.part.path, flags | os.O_DIRECT, 0o644)
                    except OSError as exc:
                        if exc.errno != errno.EINVAL:
                            raise
                        self.direct = False
                        self.fallback = f"{self.part.path.parent.parent}: {exc.strerror} (EINVAL)"
                if self.fd is None:
                    self.fd = os.open(self.part.path, flags, 0o644)
                self.fds.append(self.fd)
            return self.fd


class LazyIO(CheckpointIO):
    def __init__(self, options: Options, ds_engine, storage: dict | None = None):
        self.options = options
        self.writers = ThreadPoolExecutor(options.writers, thread_name_prefix="lazy-write")
        self.copier = ThreadPoolExecutor(1, thread_name_prefix="lazy-copy")
        self.readers = ThreadPoolExecutor(options.readers, thread_name_prefix="lazy-read")
        self.plans: dict[tuple, _Part] = {}  # (file name, layout signature) -> reusable part
        self.copies: list = []  # futures of copies not yet waited for by an optimizer step
        self.writes: list = []  # futures of writes not yet waited for by wait()
        self.side_stream = None
        self.stats: dict = {"copy_seconds": 0.0, "step_wait_seconds": 0.0, "write_seconds": 0.0,
                            "staging_wait_seconds": 0.0, "buffers_reused": 0, "buffers_allocated": 0}
        self.load_stats: dict = {"read_bytes": 0, "broadcast_bytes": 0, "broadcast_loads": 0, "prefetched_bytes": 0}
        self.submitted: list = []  # every file read (_lazy_format.Reads): its requests and those populated ahead
        self.lock = threading.Lock()
        self.last_read: dict = {}  # the buffers of the last file loaded: a second load of it reads nothing
        self.prefetch: dict = {}  # path -> (header, buffers, reads) of a file read ahead
        self.prefetch_tags: set = set()
        self.broadcast_mib_s: float | None = None
        self.read_mib_s_per_reader = _per_reader(storage)
        self.read_io = read_way(options, storage)  # {"way": "direct" | "buffered", "why": ...}
        self.read_direct = self.read_io["way"] == "direct"
        self.load_stats["read_io"] = self.read_io
        self.on_node: bool | None = None  # every data-parallel replica on this node (asked once)
        self.write_mib_s_per_writer = _per_writer(storage)
        self.step_marks: list[float] = []  # perf_counter at the last optimizer steps before the first save
        self.lag: dict = {}  # staging=auto: the save's tag directory, and the bytes its writes may still lag by
        self.ds_engine = ds_engine  # None: the format alone (tests), no step to wait in
        self.dp_rank, self.dp_size = _data_parallel(ds_engine) if ds_engine is not None else (0, 1)
        self.dp_group = getattr(getattr(ds_engine, "optimizer", None), "dp_process_group", None)
        if ds_engine is None:
            return
        if options.balance and self.dp_size > 1:
            ds_engine.save_non_zero_checkpoint = True  # every replica is handed the replicated files
        step = ds_engine._take_model_step

        def take_model_step(*args, **kwargs):
            if not self.plans:  # the optimizer step's interval, until the first save (staging=auto sizes by it)
                self.step_marks = [*self.step_marks[-3:], time.perf_counter()]
            self.wait_copied()  # nothing may change the state while it is being copied
            return step(*args, **kwargs)

        ds_engine._take_model_step = take_model_step

    # --- save -------------------------------------------------------------------------------------------------
    def save(self, state, path):
        from engines import _lazy_format as fmt

        self.last_read.clear()
        tensors, remainder = fmt.split(state)
        tensors = [t.detach() for t in tensors]
        replicated = bool(REPLICATED.search(path)) and self.options.balance and self.dp_size > 1
        total = sum(t.numel() * t.element_size() for t in tensors)
        shares = self.dp_size if replicated and total >= self.dp_size * self.options.balance_min_mib * 2**20 else 1
        if replicated and shares == 1 and self.dp_rank != 0:
            return []  # replica 0 writes this (small) file whole, as DeepSpeed would
        mine = self.dp_rank if shares > 1 else 0
        header, placements = _plan(tensors, shares)
        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        written: list[str] = []
        if mine == 0:  # the header and the remainder: small, written and fsync'd by the pool too
            small = [(d / fmt.REMAINDER, remainder), (d / fmt.HEADER, json.dumps(header).encode())]
            with self.lock:
                self.writes += [self.writers.submit(_write_small, p, data) for p, data in small]
            written += [str(p) for p, _ in small]
        part = self._part(d, mine, header["parts"][mine]["bytes"], tensors, placements)
        written.append(str(part.path))
        flush = _Flush(part, getattr(self.ds_engine, "global_steps", None), self.options.direct_io,
                       self.options.write_chunk_mib * MIB, self._hand_out)
        event = None
        if any(t.is_cuda for t in tensors) and not part.ring:
            marks = self._copy_on_side_stream(part, tensors, flush.chunk)
            copy = self.copier.submit(self._after_events, flush, marks)
            event = marks[-1][0] if marks else None
        elif any(t.is_cuda for t in tensors):  # a ring's copies wait for slots: queued by the copy thread
            import torch

            if self.side_stream is None:  # here, on the rank's device (the copy thread's current device is 0)
                self.side_stream = torch.cuda.Stream()
            made = torch.cuda.Event()
            made.record()
            copy = self.copier.submit(self._copy, flush, tensors, made)
        else:
            copy = self.copier.submit(self._copy, flush, tensors)
        with self.lock:
            self.copies.append((copy, event))
            self.writes.append(flush.done)
        return written

    def _hand_out(self, flush: _Flush, off: int) -> None:
        self.writers.submit(self._write_request, flush, off)

    def _part(self, d: Path, k: int, size: int, tensors, placements) -> _Part:
        import torch

        from engines import _lazy_format as fmt

        signature = (d.name, k, size, tuple((str(t.dtype), tuple(t.shape), t.device.type) for t in tensors))
        part = self.plans.get(signature)
        if part is not None and not part.busy:
            self.stats["buffers_reused"] += 1
        else:
            pinned = torch.cuda.is_available() and any(t.is_cuda for t in tensors)
            copies = [(i, off, n) for i, (p, off, n) in enumerate(placements) if p == k]
            chunk = self.options.write_chunk_mib * MIB
            slots, why = self._staging(d, fmt.aligned(size), chunk, pinned)
            part = _Part(d / fmt.part_name(k), size, pinned, copies, chunk, slots)
            self.plans[signature] = part
            self.stats["buffers_allocated"] += 1
            staged = self.stats.setdefault("staging", [])
            if len(staged) < STAGING_RECORDS:
                staged.append({"file": d.name, "part_bytes": size, "buffer_bytes": part.nbytes, "why": why})
        part.path = d / fmt.part_name(k)
        part.busy = True
        return part

    def _staging(self, d: Path, length: int, chunk: int, pinned: bool) -> tuple[int | None, str]:
        """How many write requests' worth a new part's buffer stages (None: the whole part), and why
        (staging_mib; docs/engines.md, "Staging"). auto: the copy may run ahead of the writes by the whole buffer,
        so a ring of the part less L bytes holds the copy back only where the writes lag it by more than L. L is
        what the writers are expected to write in half the interval between optimizer steps (W T / 2: W the storage
        probe's write ceiling a rank, T the shortest interval between the optimizer steps before the first save),
        shared by the parts of one checkpoint; the next optimizer step comes about T after the save and waits for
        the copy, so half of T is the margin for a slower disk."""
        chunks = -(-length // chunk)
        least = self.options.writers + 1  # a slot for every request in flight and one being copied
        if self.options.staging_mib:
            slots = max(self.options.staging_mib * MIB // chunk, least)
            if slots >= chunks:
                return None, f"staging_mib={self.options.staging_mib}: the whole part fits"
            return slots, (f"staging_mib={self.options.staging_mib}: a ring of {slots} requests"
                           + (f", the least: a request for each of the {self.options.writers} writers and one "
                              f"being copied"
                              if slots * chunk > self.options.staging_mib * MIB else ""))
        if chunks <= least:
            return None, (f"auto: the whole part: its {chunks} request{'s are' if chunks != 1 else ' is'} no more than a "
                          f"ring's least, writers + 1 = {least}")
        if pinned:
            return None, ("auto on CUDA: the whole part (its copies are queued on the side stream at save() and the "
                          "step waits for them on the GPU; a ring's must wait on the host)")
        w = self.write_mib_s_per_writer
        intervals = [b - a for a, b in zip(self.step_marks, self.step_marks[1:], strict=False)]
        if not w or not intervals:
            return None, ("auto: the whole part (" + ("no storage probe with a write figure"
                                                      if not w else "fewer than two optimizer steps before the save")
                          + ")")
        tag = str(d.parent)
        if self.lag.get("tag") != tag:
            self.lag = {"tag": tag, "left": int(w * MIB * min(intervals) / 2)}
        reuse = min(self.lag["left"] // chunk, chunks - least)
        if reuse <= 0:
            return None, (f"auto: the whole part: the writes may lag the copy by only {self.lag['left'] / MIB:,.1f} MiB "
                          f"more in this checkpoint, less than a request")
        self.lag["left"] -= reuse * chunk
        return chunks - reuse, (f"auto: a ring of {chunks - reuse} of the part's {chunks} requests: the writers "
                                f"({w:,.0f} MiB/s a rank, the storage probe's write ceiling) are expected to write "
                                f"what the ring reuses within half the {min(intervals):.3f} s between optimizer steps")

    def _copy(self, flush: _Flush, tensors, after=None) -> None:
        """The tensors into the part's buffer in offset order, a tensor that spans write requests a request's bytes
        at a time; after each, the requests it completed go to the writers (the gap to the next tensor is padding,
        zero already). In a ring, each request's slot is taken first (_Flush.claim_upto). after: a CUDA event on
        the stream that made the tensors: the copies go on the side stream behind it (a ring's device->host copies,
        which must wait for slots, so they cannot all be queued at save())."""
        import torch

        start = time.perf_counter()
        part, chunk = flush.part, flush.chunk
        try:
            with self._on_side_stream(after):
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
                    src = (t if t.is_contiguous() else t.contiguous()).reshape(-1).view(torch.uint8)
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
            self._add("copy_seconds", time.perf_counter() - start - flush.waited)  # copying, not waiting for slots
            self._add("staging_wait_seconds", flush.waited)

    def _on_side_stream(self, after):
        """The side stream (made by save() on the rank's device; entering it also makes that device current in the
        copy thread), behind the event `after` (None: no CUDA copies: nothing)."""
        if after is None:
            return contextlib.nullcontext()
        import torch

        self.side_stream.wait_event(after)
        return torch.cuda.stream(self.side_stream)

    def _add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.stats[name] += seconds

    def _copy_on_side_stream(self, part: _Part, tensors, chunk: int) -> list:
        """The device->host copies queued on a side stream, after the work the current stream has queued so far; an
        event after every request's worth of bytes, so the writes follow the copy; the last event also goes to the
        next optimizer step (wait_copied)."""
        import torch

        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream()
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
                    nxt = part.copies[j + 1][1] if j + 1 < len(part.copies) else None
                    marks.append((event, nxt))
                    since = 0
        return marks

    def _after_events(self, flush: _Flush, marks: list) -> None:
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
            self._add("copy_seconds", time.perf_counter() - start)

    def _write_request(self, flush: _Flush, off: int) -> None:
        """One write request of the part (handed out once the copy has passed its end); the last one to finish
        completes the part (_finish)."""
        end = min(off + flush.chunk, flush.length)
        error = None
        try:
            if flush.error is None:
                with flush.lock:
                    if flush.started is None:
                        flush.started = time.perf_counter()
                fd = flush.descriptor()
                pos = off
                data = flush.data(off, end)
                while pos < end:
                    try:
                        pos += os.pwrite(fd, data[pos - off:], pos)
                    except OSError as exc:  # a file system that takes the O_DIRECT open and refuses the request
                        if exc.errno != errno.EINVAL:
                            raise
                        why = f"{flush.part.path.parent.parent}: {exc.strerror} (EINVAL)"
                        buffered = flush.descriptor(refused=why)
                        if buffered == fd:
                            raise  # refused buffered too: not O_DIRECT's doing
                        fd = buffered
                faults.hit("flush", int(os.environ.get("RANK", "0")), flush.step)  # tests: killed mid-flush
        except BaseException as exc:  # noqa: BLE001 - handed to flush.done by _finish, raised by wait()
            error = exc
        with flush.lock:
            flush.left -= 1
            last = flush.left == 0
            if error is not None and flush.error is None:
                flush.error = error
        flush.release(off)
        if last:
            self._finish(flush)

    def _finish(self, flush: _Flush) -> None:
        part = flush.part
        try:
            if flush.error is None:
                fd = flush.descriptor()
                if flush.length != part.size:
                    os.ftruncate(fd, part.size)
                os.fsync(fd)
        except OSError as exc:
            flush.error = exc
        finally:
            for fd in flush.fds:
                os.close(fd)
            part.busy = False
            if flush.fallback:
                with self.lock:  # the file system refuses O_DIRECT: buffered, and said so in the save's record
                    self.stats["direct_io_fallback"] = flush.fallback
            if flush.started is not None:
                self._add("write_seconds", time.perf_counter() - flush.started)
        if flush.error is not None:
            flush.done.set_exception(flush.error)
        else:
            flush.done.set_result(None)

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
                import torch

                torch.cuda.current_stream().wait_event(event)
            else:
                copy.result()
        self._add("step_wait_seconds", time.perf_counter() - start)

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
        """The save's account (summed over the run); staging_bytes: the parts kept for later saves, their bytes and
        their buffers' (docs/engines.md#staging)."""
        parts = list(self.plans.values())
        staged = {"staging_bytes": {"parts": len(parts), "part_bytes": sum(p.size for p in parts),
                                    "buffer_bytes": sum(p.nbytes for p in parts)}} if parts else {}
        return {**{k: round(v, 6) if isinstance(v, float) else v for k, v in self.stats.items()}, **staged}

    def load_statistics(self) -> dict:
        """What the restart's loads did (summed over ranks in the summary); read_requests and populated_requests: the
        16 MiB requests read, and those whose fresh pages a thread faulted in ahead of them (_lazy_format.Reads)."""
        return {**self.load_stats, "read_requests": sum(r.requests for r in self.submitted),
                "populated_requests": sum(r.populated for r in self.submitted)}

    # --- load -------------------------------------------------------------------------------------------------
    def load(self, path, map_location=None, into=None):
        import torch

        from engines import _lazy_format as fmt

        if fmt.is_lazy(path):
            shared = self.dp_size > 1 and self.dp_group is not None and REPLICATED.search(path)
            return fmt.load(path, threads=self.options.readers, map_location=map_location, reuse=self.last_read,
                            reader=self._replicated_read if shared else self._read)
        return torch.load(path, map_location=map_location, weights_only=False)

    def _read(self, path: Path, first: list[int] | None = None, direct: bool | None = None):
        """The file's parts read here (the parts in `first` queued first; direct: O_DIRECT or buffered, None the
        restart's read way), the rank's own ZeRO file queued behind them; or, where it was read ahead, what is left
        of that."""
        from engines import _lazy_format as fmt

        ahead = self.prefetch.pop(str(path), None)
        if ahead is not None:  # read ahead while an earlier file was loaded: wait for what is left of it
            header, buffers, reads = ahead
            for r in reads:
                r.wait()
            fmt.check_parts(path, header)
        else:
            header = fmt.read_header(path)
            fmt.check_parts(path, header)
            buffers = [fmt.aligned_empty(p["bytes"]) for p in header["parts"]]
            first = first or []
            reads = self._submit(path, header, buffers, [*first, *(k for k in range(len(buffers)) if k not in first)],
                                 direct)
            self._read_ahead(path)
            for r in reads:
                r.wait()
        remainder = (path / header["remainder"]).read_bytes()
        self.load_stats["read_bytes"] += sum(b.numel() for b in buffers) + len(remainder)
        return header, remainder, buffers

    def _submit(self, path: Path, header: dict, buffers: list, parts, direct: bool | None = None) -> list:
        from engines import _lazy_format as fmt

        direct = self.read_direct if direct is None else direct
        reads = [fmt.Reads(path / header["parts"][k]["file"], buffers[k], self.readers, direct) for k in parts]
        self.submitted += reads
        return reads

    def _own_zero_file(self, tag_dir: Path) -> Path | None:
        """This rank's own ZeRO file of the tag, named by DeepSpeed's own function (the one its load reads)."""
        engine = self.ds_engine
        try:
            if engine is None or not engine.zero_optimization() or engine.zero_elastic_checkpoint():
                return None
            return Path(engine._get_zero_ckpt_name(str(tag_dir.parent), tag_dir.name))
        except (AttributeError, TypeError, ValueError):
            return None

    def _ahead_bytes(self, path: Path) -> tuple[Path | None, dict | None]:
        """The file _read_ahead would read ahead while `path` loads, and its header (None: nothing to read ahead)."""
        from engines import _lazy_format as fmt

        tag_dir = path.parent
        if tag_dir in self.prefetch_tags:
            return None, None
        own = self._own_zero_file(tag_dir)
        if own is None or own == path or not fmt.is_lazy(own):
            return None, None
        try:
            header = fmt.read_header(own)
            fmt.check_parts(own, header)
        except (OSError, ValueError):
            return None, None  # its own load will say what is wrong with it
        return own, header

    def _read_ahead(self, path: Path) -> None:
        """Once per tag, once the first file's own requests are queued (and a broadcast of it done): this rank's own
        ZeRO file, queued behind them, so the storage stays busy while DeepSpeed deserializes the first file and
        copies it into the model."""
        from engines import _lazy_format as fmt

        own, header = self._ahead_bytes(path)
        self.prefetch_tags.add(path.parent)
        if own is None:
            return
        buffers = [fmt.aligned_empty(p["bytes"]) for p in header["parts"]]
        self.prefetch[str(own)] = (header, buffers, self._submit(own, header, buffers, range(len(buffers))))
        self.load_stats["prefetched_bytes"] += sum(b.numel() for b in buffers)

    def _replicated_read(self, path: Path):
        """A replicated file: replica 0 reads its header and remainder and tells the others with them; then
        broadcast_load's way: every replica reads it all (false), the broadcast (true), or (auto) where every replica
        is on this node and its shared memory holds the file, each replica reads its own share into one shared
        mapping that all of them build their tensors on (_shared_read: the fewest bytes read and none moved), else
        every replica first reads its own share, which both other ways read, the group measures the storage (that
        read) and the broadcast, and every replica takes the way replicated_way() gives on the same figures. The
        rank's own ZeRO file is queued behind this file's reads. A replica that cannot read fails every replica with
        its reason."""
        import deepspeed.comm as dist

        from engines import _lazy_format as fmt

        group, choice = self.dp_group, self.options.broadcast_load
        on_node = choice == "auto" and self._replicas_on_node()
        small: list = [None, None, None, None]  # header, remainder, error, the shared mapping's file (or why not)
        if self.dp_rank == 0:
            try:
                header = fmt.read_header(path)
                fmt.check_parts(path, header)
                small[:2] = header, (path / header["remainder"]).read_bytes()
                if on_node:
                    small[3] = _shm_create(_shm_layout(header)[1])
            except (OSError, ValueError) as exc:
                small[2] = f"{type(exc).__name__}: {exc}"
        dist.broadcast_object_list(small, src=dist.get_global_rank(group, 0), group=group)
        header, remainder, error, shm = small
        if error:
            raise OSError(f"{path}: data-parallel replica 0 could not read it for the group: {error}")
        start = time.perf_counter()
        mine = [k for k in range(len(header["parts"])) if k % self.dp_size == self.dp_rank]
        out, decision = None, None
        if shm and shm.get("file"):
            out, why_not = self._shared_read(path, header, remainder, shm["file"], mine)
            if out is not None:
                decision = {"way": "shared", "why": "shared: every data-parallel replica is on this node, so each "
                                                    "read its own share into one shared-memory mapping and all build "
                                                    "their tensors on it (the file read once, nothing broadcast or "
                                                    "copied)"}
            else:
                shm = {"why_not": why_not}
        if out is not None:
            pass
        elif choice == "false":
            decision, out = {"way": "read", "why": "broadcast_load=false"}, self._read(path, first=mine)
        else:
            buffers = [fmt.aligned_empty(p["bytes"]) for p in header["parts"]]
            reader_mib_s = self._read_share(path, header, buffers, mine)
            if choice == "true":
                decision = {"way": "broadcast", "why": "broadcast_load=true"}
            else:
                decision = self._decide(sum(p["bytes"] for p in header["parts"]), reader_mib_s)
                if on_node:
                    decision["why"] += f"; not shared memory: {(shm or {}).get('why_not')}"
            if decision["way"] == "broadcast":
                # the rank's own ZeRO file queued before the broadcast, so the storage is not idle while it runs:
                # in 9 paired restarts of a small dp=2 (2026-11-27, 2 cores, O_DIRECT) the load was sooner in 7,
                # median 0.81 s against 0.90, though the broadcast itself slows beside the reads
                self._read_ahead(path)
                self._broadcast_parts(header, remainder, buffers, mine)
            else:  # the other shares first, then the rank's own ZeRO file behind them
                reads = self._submit(path, header, buffers, [k for k in range(len(buffers)) if k not in mine])
                self._read_ahead(path)
                for r in reads:
                    r.wait()
                self.load_stats["read_bytes"] += sum(b.numel() for b in buffers)
                self.load_stats["read_bytes" if self.dp_rank == 0 else "broadcast_bytes"] += len(remainder)
            out = header, remainder, buffers
        self.load_stats.setdefault("replicated", []).append(
            {"file": path.name, **decision, "seconds": round(time.perf_counter() - start, 6)})
        return out

    def _replicas_on_node(self) -> bool:
        """Is every replica of the data-parallel group on this node? Asked of the group once per restart."""
        if self.on_node is None:
            import socket

            import deepspeed.comm as dist

            hosts: list = [None] * self.dp_size
            dist.all_gather_object(hosts, socket.gethostname(), group=self.dp_group)
            self.on_node = len(set(hosts)) == 1
        return self.on_node

    def _shared_read(self, path: Path, header: dict, remainder: bytes, shm: str, mine: list[int]):
        """The shared way: every replica maps the file replica 0 made in shared memory (and says whether it could:
        a replica in another container may not see it, then no replica takes this way), replica 0 unlinks it once
        all have it mapped (nothing is left behind, whatever happens next), each reads its own parts into the
        mapping, the group learns that every part is there, and the tensors are views of the mapping. Returns
        ((header, remainder, buffers), None), or (None, why not) where some replica could not map it."""
        import mmap

        import torch

        offsets, total = _shm_layout(header)
        mapped, why = None, None
        try:
            fd = os.open(shm, os.O_RDWR)
            try:
                if os.fstat(fd).st_size != total:
                    raise OSError(f"{shm}: {os.fstat(fd).st_size} bytes, {total} expected")
                mapped = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
        except OSError as exc:
            why = f"replica {self.dp_rank} could not map {shm}: {exc.strerror or exc}"
        flags = torch.tensor([0.0 if mapped is None else 1.0], dtype=torch.float64)
        _all_reduce(flags, "min", self.dp_group)
        if self.dp_rank == 0:
            with contextlib.suppress(OSError):
                os.unlink(shm)
        if not flags[0].item():
            return None, why or "another replica could not map the shared memory (its log says why)"
        whole = torch.frombuffer(mapped, dtype=torch.uint8)  # keeps the mapping alive as long as a view of it
        buffers = [whole[o:o + p["bytes"]] for o, p in zip(offsets, header["parts"], strict=True)]
        self._read_share(path, header, buffers, mine, then_ahead=True)
        read = sum(buffers[k].numel() for k in mine) + (len(remainder) if self.dp_rank == 0 else 0)
        self.load_stats["read_bytes"] += read
        self.load_stats["shared_bytes"] = self.load_stats.get("shared_bytes", 0) + sum(
            b.numel() for b in buffers) + len(remainder) - read
        return (header, remainder, buffers), None

    def _read_share(self, path: Path, header: dict, buffers: list, mine: list[int],
                    then_ahead: bool = False) -> float | None:
        """This replica's parts of a replicated file; returns the slowest replica's read bandwidth of its share
        (MiB/s; all-reduced: every replica gets the same), None where a share is too small to time (under 1 MiB). A
        replica that could not read fails every replica. then_ahead: the rank's own ZeRO file queued behind the
        share (its reads then share the storage with the share's: the bandwidth is not the storage's alone)."""
        import torch

        started = time.perf_counter()
        failed = None
        try:
            reads = self._submit(path, header, buffers, mine)
            if then_ahead:
                self._read_ahead(path)
            for r in reads:
                r.wait()
        except OSError as exc:
            failed = exc
        seconds = time.perf_counter() - started
        share = sum(buffers[k].numel() for k in mine)
        rate = share / MIB / seconds if share >= MIB and seconds > 0 else -1.0
        figures = torch.tensor([0.0 if failed else 1.0, rate], dtype=torch.float64)
        _all_reduce(figures, "min", self.dp_group)
        if failed:
            raise failed
        if not figures[0].item():
            raise OSError(f"{path}: another data-parallel replica could not read its part of it (its own error "
                          "is in its log)")
        return figures[1].item() if figures[1].item() > 0 else None

    def _decide(self, file_bytes: int, reader_mib_s: float | None) -> dict:
        """broadcast_load=auto, once this replica's share is read: the group's broadcast bandwidth measured now, the
        storage's read bandwidth per reader as the group's own share reads just gave it (the run's probe where a share
        was too small to time), and replicated_way() on those figures, the same on every replica."""
        source = "the group's own share reads just now"
        if reader_mib_s is None:
            reader_mib_s, source = self.read_mib_s_per_reader, "the run's storage probe (the shares were too small)"
        if reader_mib_s:
            self._measure_broadcast(file_bytes)
        decision = replicated_way(file_bytes, self.dp_size, self.broadcast_mib_s, reader_mib_s)
        if reader_mib_s:
            decision["read_mib_s_from"] = source
            decision["why"] += f"; the storage's figure from {source}"
        return decision

    def _measure_broadcast(self, file_bytes: int) -> None:
        """The broadcast's bandwidth over the data-parallel group (MiB/s to every other replica), once per restart:
        one timed broadcast of a share's size (at least 1 MiB, at most BROADCAST_PROBE_BYTES) after a barrier, its
        slowest replica's seconds (all-reduced, so every replica has the same figure)."""
        import deepspeed.comm as dist
        import torch

        if self.broadcast_mib_s is not None:
            return
        group = self.dp_group
        nbytes = max(MIB, min(BROADCAST_PROBE_BYTES, file_bytes // self.dp_size))
        buf = torch.zeros(nbytes, dtype=torch.uint8)
        dist.barrier(group=group)
        start = time.perf_counter()
        self._group_broadcast(buf, dist.get_global_rank(group, 0))
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        _all_reduce(seconds, "max", group)
        self.broadcast_mib_s = nbytes / MIB / max(float(seconds.item()), 1e-9)

    def _group_broadcast(self, buf, src: int) -> None:
        """A host buffer broadcast over the data-parallel group: directly where its backend takes host tensors
        (gloo), through a device buffer a request's worth at a time where it does not (NCCL)."""
        import deepspeed.comm as dist
        import torch
        import torch.distributed as tdist

        group = self.dp_group
        if tdist.get_backend(group) != "nccl":
            dist.broadcast(buf, src=src, group=group)
            return
        step = CEILING_REQUEST_BYTES
        staging = torch.empty(min(step, buf.numel()), dtype=torch.uint8, device=torch.cuda.current_device())
        mine = tdist.get_rank() == src
        for a in range(0, buf.numel(), step):
            n = min(step, buf.numel() - a)
            if mine:
                staging[:n].copy_(buf[a:a + n])
            dist.broadcast(staging[:n], src=src, group=group)
            if not mine:
                buf[a:a + n].copy_(staging[:n])

    def _broadcast_parts(self, header: dict, remainder: bytes, buffers: list, mine: list[int]) -> None:
        """The broadcast way, once every replica has read its share (part k by replica k % dp): every part reaches
        the other replicas by broadcast (gloo here, NCCL's through the device on GPUs), through DeepSpeed's comm
        (the anatomy counts its collectives as wait)."""
        import deepspeed.comm as dist

        group, size = self.dp_group, self.dp_size
        for k, buf in enumerate(buffers):
            self._group_broadcast(buf, dist.get_global_rank(group, k % size))
        read = sum(buffers[k].numel() for k in mine) + (len(remainder) if self.dp_rank == 0 else 0)
        self.load_stats["read_bytes"] += read
        self.load_stats["broadcast_bytes"] += sum(b.numel() for b in buffers) + len(remainder) - read
        self.load_stats["broadcast_loads"] += 1

    def preserves_storage_sharing(self):
        return False  # each view's own elements are copied: no defensive clone needed

    def is_data_parallel_writer(self, dp_rank):
        return dp_rank == 0 or (self.options.balance and self.dp_size > 1)


SHM_DIR = Path("/dev/shm")  # POSIX shared memory's file system on Linux
SHM_HEADROOM = 0.5  # the shared way takes at most this fraction of the shared memory's free bytes


def _shm_layout(header: dict) -> tuple[list[int], int]:
    """Where each part of a file goes in its shared mapping: at 2 MiB boundaries, each with room for its O_DIRECT
    padding; and the mapping's size."""
    from engines import _lazy_format as fmt

    offsets, at = [], 0
    for part in header["parts"]:
        offsets.append(at)
        at += fmt.aligned(fmt.aligned(part["bytes"]), fmt.HUGE_PAGE)
    return offsets, max(at, fmt.ALIGNMENT)


def _shm_create(nbytes: int) -> dict:
    """A file of nbytes in shared memory for the group to map ({"file": path}), or why not ({"why_not": ...}):
    no /dev/shm, or too little of it free (a container's is often 64 MiB)."""
    import secrets

    try:
        stat = os.statvfs(SHM_DIR)
    except OSError as exc:
        return {"why_not": f"{SHM_DIR}: {exc.strerror or exc}"}
    free = stat.f_bavail * stat.f_frsize
    if nbytes > free * SHM_HEADROOM:
        return {"why_not": f"{SHM_DIR} has {free / MIB:,.0f} MiB free, the file needs {nbytes / MIB:,.0f} MiB (at most "
                           f"{SHM_HEADROOM:.0%} of it is taken)"}
    path = SHM_DIR / f"rh-lazy-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        return {"why_not": f"{path}: {exc.strerror or exc}"}
    os.close(fd)
    return {"file": str(path)}


def read_way(options: Options, storage: dict | None) -> dict:
    """How the part files are read at restart: read_io's way, or (auto) the faster of the storage probe's two reads
    in this engine's own shape (files/baseline.py: the ceiling probe read with O_DIRECT and through the page cache,
    `readers`-like threads of 16 MiB requests); the baseline's single buffered stream is not a way this engine
    reads, so it decides only where the probe has no buffered read (probes before 2026-11-27): then the way the
    read ceiling came from. Without a probe that has a ceiling (baseline=false, object storage, a failed probe),
    direct_io's."""
    if options.read_io != "auto":
        return {"way": options.read_io, "why": f"read_io={options.read_io}"}
    ceiling = (storage or {}).get("ceiling") if storage and not storage.get("error") else None
    source = (ceiling or {}).get("read_from")
    if source not in ("direct", "buffered", "baseline"):
        way = "direct" if options.direct_io else "buffered"
        return {"way": way, "why": f"no storage probe with a ceiling to go by: direct_io={str(options.direct_io).lower()}"}
    probe = ceiling.get("direct") or {}
    direct, buffered = probe.get("read_mib_s"), probe.get("buffered_read_mib_s")
    if direct and buffered and not probe.get("refused"):
        shape = "faster in the probe's cold reads in this engine's shape"
        if direct >= buffered:
            return {"way": "direct", "why": f"{shape}, O_DIRECT {direct:,.0f} MiB/s against buffered {buffered:,.0f}"}
        return {"way": "buffered", "why": f"{shape}, buffered {buffered:,.0f} MiB/s against O_DIRECT {direct:,.0f}"}
    if source == "direct":
        return {"way": "direct", "why": "the storage's read ceiling came from the O_DIRECT probe"}
    return {"way": "buffered", "why": f"the storage's read ceiling came from its {source} read"}


def _per_writer(storage: dict | None) -> float | None:
    """The storage's write bandwidth per rank (MiB/s): _per_rank's, writing."""
    return _per_rank(storage, "write_mib_s")


def _per_reader(storage: dict | None) -> float | None:
    """The storage's read bandwidth per reader (MiB/s): _per_rank's, reading."""
    return _per_rank(storage, "read_mib_s")


def _per_rank(storage: dict | None, figure: str) -> float | None:
    """The probe's ceiling (else its baseline) figure over its concurrent ranks; None without a probe."""
    if not storage or storage.get("error"):
        return None
    total = (storage.get("ceiling") or {}).get(figure) or storage.get(figure)
    return total / (storage.get("ranks") or 1) if total else None


def _all_reduce(tensor, op: str, group) -> None:
    """An all-reduce over the group, on the device where the group's backend wants one (NCCL)."""
    import deepspeed.comm as dist
    import torch
    import torch.distributed as tdist

    reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN
    if tdist.get_backend(group) == "nccl":
        on_device = tensor.to(torch.cuda.current_device())
        dist.all_reduce(on_device, op=reduce_op, group=group)
        tensor.copy_(on_device.cpu())
    else:
        dist.all_reduce(tensor, op=reduce_op, group=group)


def _data_parallel(ds_engine) -> tuple[int, int]:
    import torch.distributed as dist

    group = getattr(ds_engine.optimizer, "dp_process_group", None)
    if group is None or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group=group), dist.get_world_size(group=group)


def _plan(tensors, shares: int) -> tuple[dict, list[tuple[int, int, int]]]:
    """The header, and (part, offset, nbytes) of each tensor: tensors in order, cut into `shares` parts of about
    equal bytes, each tensor at an aligned offset of its part."""
    from engines import _lazy_format as fmt

    sizes = [t.numel() * t.element_size() for t in tensors]
    total = sum(sizes)
    placements, part, offset, done = [], 0, 0, 0
    ends = [0] * shares
    for n in sizes:
        if part < shares - 1 and offset > 0 and done + n / 2 > total * (part + 1) / shares:
            ends[part] = offset
            part, offset = part + 1, 0
        placements.append((part, offset, n))
        offset = fmt.aligned(offset + n)
        done += n
    ends[part] = offset
    header = {
        "format": fmt.FORMAT, "version": fmt.VERSION, "alignment": fmt.ALIGNMENT,
        "tensors": [{"dtype": fmt.dtype_name(t.dtype), "shape": list(t.shape), "part": p, "offset": o,
                     "nbytes": n} for t, (p, o, n) in zip(tensors, placements, strict=True)],
        # part k of a file split over replicas is written by data-parallel rank k
        "parts": [{"file": fmt.part_name(k), "bytes": ends[k], "writer_dp_rank": k} for k in range(shares)],
        "remainder": fmt.REMAINDER,
    }
    return header, placements


def _write_small(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view, pos = memoryview(data), 0
        while pos < len(view):
            pos += os.write(fd, view[pos:])
        os.fsync(fd)
    finally:
        os.close(fd)
