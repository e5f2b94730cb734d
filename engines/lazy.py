"""engine=lazy: the harness's own engine, built to show how close to the storage a checkpoint can get.

Save (DeepSpeed's save_checkpoint drives it, file by file):
  1. save() takes references, not copies: it pickles the non-tensor remainder (small), plans where every tensor goes
     (engines/_lazy_format.py: raw bytes at aligned offsets in one part file per writer) and returns.
  2. a copy thread copies the tensors into host buffers while the next forward and backward run; the next optimizer
     step (DeepSpeed's _take_model_step, wrapped) waits only for copies not yet done. On CUDA the copies run
     device->host into pinned buffers on a side stream, and the step waits on the copy's event on the GPU, not on
     the host. Buffers and the write plan are kept per file name and layout and reused by every later save.
  3. a pool of writer threads writes each part from its buffer in large aligned requests (pwrite, no pickling of
     tensor data), then fsyncs it; the harness fsyncs the directories and commits `latest` once every rank is done.
  4. a file replicated over data-parallel ranks (a pp=1 run's model weights, which DeepSpeed has replica 0 write
     alone) is written by all replicas in balanced shares (parts of the same directory); pipeline layer files are
     spread over replicas by DeepSpeed's own checkpoint.parallel_write.pipeline_stage.
Load: every part read into one preallocated buffer by parallel large reads, tensors built as views of it (no copy).

Format, reader, converter to DeepSpeed's torch.save layout: engines/_lazy_format.py.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engines.base import CheckpointIO, Engine, EngineContext, FileLayout
from restart_harness import faults
from restart_harness.spec.keys import key

# the files DeepSpeed has data-parallel replica 0 write (not ZeRO-3's zero_pp_rank_N_mp_rank_NN_model_states.pt: a
# data-parallel rank's own)
REPLICATED = re.compile(r"(?:^|/)mp_rank_\d+_model_states\.pt$")


@dataclass
class Options:
    writers: int = key(4, "writer threads per rank (parallel large writes of the part files)", group="checkpoint",
                       minimum=1, maximum=256)
    readers: int = key(4, "reader threads per rank at restart (parallel large reads)", group="checkpoint",
                       minimum=1, maximum=256)
    write_chunk_mib: int = key(16, "bytes per write request", group="checkpoint", unit="MiB", minimum=1)
    balance: bool = key(True, "replicated model files written by all data-parallel replicas in balanced shares "
                              "(false: by replica 0, as DeepSpeed does)", group="checkpoint")
    balance_min_mib: int = key(4, "split a replicated file only when each share gets at least this much",
                               group="checkpoint", unit="MiB", minimum=0)
    # the default since 2026-11-25: on this project's disk O_DIRECT made a small dp=2 save durable 4.9x sooner and its
    # restart load 1.5x faster than buffered I/O (docs/benchmarks.md#lazy-at-the-storage-limit)
    direct_io: bool = key(True, "write and read the part files with O_DIRECT (aligned buffers and requests, no page "
                                "cache; false: buffered); where the file system refuses it, buffered I/O, recorded as "
                                "direct_io_fallback in the save's engine_statistics", group="checkpoint")
    broadcast_load: bool = key(True, "at restart, a replicated model file is read once per data-parallel group (each "
                                     "part by one replica) and broadcast to the other replicas (false: every replica "
                                     "reads all of it)", group="checkpoint")


class LazyFiles(FileLayout):
    """DeepSpeed's files; with broadcast_load a replicated model file is read once per data-parallel group."""

    def restart_read_bytes(self, path: str, nbytes: int, dp_rank: int) -> int:
        """With broadcast_load, a replicated model file is read once per data-parallel group: in shares (part k by
        replica k) where it was written in shares, else by replica 0 (LazyIO._broadcast_read)."""
        dp, o = self.spec.dp, self.options
        if not (o.broadcast_load and dp > 1 and REPLICATED.search(path)):
            return nbytes
        if o.balance and nbytes >= dp * o.balance_min_mib * 2**20:
            return nbytes // dp + (nbytes % dp if dp_rank == 0 else 0)
        return nbytes if dp_rank == 0 else 0


class LazyEngine(Engine):
    name = "lazy"
    description = ("the harness's own: lazy copy overlapping the next step, parallel aligned writes, balanced "
                   "replica writes, parallel reads into preallocated buffers (engines/_lazy_format.py)")
    Options = Options
    emulates = False  # needs the DeepSpeed engine to hook its optimizer step
    file_layout = LazyFiles
    durable_on_wait = True  # its writers fsync each part file before wait() returns

    def asynchronous(self) -> bool:
        return True

    def ds_config(self) -> dict:
        return {"checkpoint": {"parallel_write": {"pipeline_stage": True}}} if self.spec.pp > 1 else {}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return LazyIO(self.options, ctx.training)


class _Part:
    """One part file this rank writes: its buffer, and which tensors go where in it. The buffer starts at an
    ALIGNMENT boundary and is zeroed once (the gaps between aligned tensors and the padding after the last are
    written as zeros), so an O_DIRECT write can take it whole."""

    def __init__(self, path: Path, size: int, pinned: bool, copies: list[tuple[int, int, int]]):
        from engines import _lazy_format as fmt

        self.path, self.size = path, size
        self.buffer = fmt.aligned_empty(size, pinned=pinned, zeroed=True)
        self.copies = copies  # (tensor index, offset, nbytes)
        self.busy = False


class LazyIO(CheckpointIO):
    def __init__(self, options: Options, ds_engine):
        self.options = options
        self.writers = ThreadPoolExecutor(options.writers, thread_name_prefix="lazy-write")
        self.copier = ThreadPoolExecutor(1, thread_name_prefix="lazy-copy")
        self.plans: dict[tuple, _Part] = {}  # (file name, layout signature) -> reusable part
        self.copies: list = []  # futures of copies not yet waited for by an optimizer step
        self.writes: list = []  # futures of writes not yet waited for by wait()
        self.cuda_events: list = []
        self.side_stream = None
        self.stats = {"copy_seconds": 0.0, "step_wait_seconds": 0.0, "write_seconds": 0.0, "buffers_reused": 0,
                      "buffers_allocated": 0}
        self.load_stats = {"read_bytes": 0, "broadcast_bytes": 0, "broadcast_loads": 0}
        self.lock = threading.Lock()
        self.last_read: dict = {}  # the buffers of the last file loaded: a second load of it reads nothing
        self.ds_engine = ds_engine  # None: the format alone (tests), no step to wait in
        self.dp_rank, self.dp_size = _data_parallel(ds_engine) if ds_engine is not None else (0, 1)
        self.dp_group = getattr(getattr(ds_engine, "optimizer", None), "dp_process_group", None)
        if ds_engine is None:
            return
        if options.balance and self.dp_size > 1:
            ds_engine.save_non_zero_checkpoint = True  # every replica is handed the replicated files
        step = ds_engine._take_model_step

        def take_model_step(*args, **kwargs):
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
        if any(t.is_cuda for t in tensors):
            event = self._copy_on_side_stream(part, tensors)
            copy = self.copier.submit(self._after_event, event)
        else:
            copy = self.copier.submit(self._copy, part, tensors)
        step = getattr(self.ds_engine, "global_steps", None)
        with self.lock:
            self.copies.append(copy)
            self.writes.append(self.writers.submit(self._write_after, copy, part, step))
        return written

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
            part = _Part(d / fmt.part_name(k), size, pinned, copies)
            self.plans[signature] = part
            self.stats["buffers_allocated"] += 1
        part.path = d / fmt.part_name(k)
        part.busy = True
        return part

    def _copy(self, part: _Part, tensors) -> None:
        start = time.perf_counter()
        for i, off, n in part.copies:
            t = tensors[i]
            part.buffer[off:off + n].view(t.dtype).view(t.shape).copy_(t)
        self._add("copy_seconds", time.perf_counter() - start)

    def _add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.stats[name] += seconds

    def _copy_on_side_stream(self, part: _Part, tensors):
        import torch

        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream()
        self.side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side_stream):
            for i, off, n in part.copies:
                t = tensors[i]
                part.buffer[off:off + n].view(t.dtype).view(t.shape).copy_(t, non_blocking=True)
                if t.is_cuda:  # a CPU tensor (an optimizer's step count) is copied before copy_ returns
                    t.record_stream(self.side_stream)
            event = torch.cuda.Event()
            event.record(self.side_stream)
        self.cuda_events.append(event)
        return event

    def _after_event(self, event) -> None:
        start = time.perf_counter()
        event.synchronize()
        self._add("copy_seconds", time.perf_counter() - start)

    def _write_after(self, copy, part: _Part, step: int | None) -> None:
        copy.result()
        start = time.perf_counter()
        try:
            direct = self.options.direct_io
            try:
                self._write(part, step, direct)
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                with self.lock:  # the file system refuses O_DIRECT: buffered, and said so in the save's record
                    self.stats["direct_io_fallback"] = f"{part.path.parent.parent}: {exc.strerror} (EINVAL)"
                self._write(part, step, False)
        finally:
            part.busy = False
        self._add("write_seconds", time.perf_counter() - start)

    def _write(self, part: _Part, step: int | None, direct: bool) -> None:
        """The part's buffer into its file in requests of write_chunk_mib at aligned offsets, then fsync; with
        direct, O_DIRECT requests of whole aligned blocks (the zero padding cut off again by ftruncate)."""
        from engines import _lazy_format as fmt

        chunk = self.options.write_chunk_mib * 2**20
        view = fmt.padded_view(part.buffer) if direct else fmt.byte_view(part.buffer)
        length = len(view)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        fd = os.open(part.path, flags, 0o644)
        try:
            for off in range(0, length, chunk):
                end, pos = min(off + chunk, length), off
                while pos < end:
                    pos += os.pwrite(fd, view[pos:end], pos)
                faults.hit("flush", int(os.environ.get("RANK", "0")), step)  # tests: killed mid-flush
            if length != part.size:
                os.ftruncate(fd, part.size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def wait_copied(self) -> None:
        """Before an optimizer step: the copies of every save so far are done (on CUDA: the step's stream waits for
        them on the GPU)."""
        with self.lock:
            copies, self.copies = self.copies, []
            events, self.cuda_events = self.cuda_events, []
        if not copies:
            return
        start = time.perf_counter()
        if events:
            import torch

            for event in events:
                torch.cuda.current_stream().wait_event(event)
        else:
            for c in copies:
                c.result()
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
        return {"host_bytes": sum(p.size for p in parts),
                "pinned_bytes": sum(p.size for p in parts if p.buffer.is_pinned())}

    def statistics(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in self.stats.items()}

    def load_statistics(self) -> dict:
        return dict(self.load_stats)

    # --- load -------------------------------------------------------------------------------------------------
    def load(self, path, map_location=None, into=None):
        import torch

        from engines import _lazy_format as fmt

        if fmt.is_lazy(path):
            shared = (self.options.broadcast_load and self.dp_size > 1 and self.dp_group is not None
                      and REPLICATED.search(path))
            return fmt.load(path, threads=self.options.readers, map_location=map_location, reuse=self.last_read,
                            reader=self._broadcast_read if shared else self._read)
        return torch.load(path, map_location=map_location, weights_only=False)

    def _read(self, path: Path):
        from engines import _lazy_format as fmt

        header, remainder, buffers = fmt.read(path, self.options.readers, direct=self.options.direct_io)
        self.load_stats["read_bytes"] += sum(b.numel() for b in buffers) + len(remainder)
        return header, remainder, buffers

    def _broadcast_read(self, path: Path):
        """A replicated file, read once by the data-parallel group: replica 0 reads its header and remainder, replica
        k % dp its part k; every byte reaches the others by broadcast (gloo here, NCCL's on GPUs where the group is
        one), through DeepSpeed's comm (the anatomy counts its collectives as wait). A replica that cannot read its
        share fails every replica with its reason, none waits for it."""
        import deepspeed.comm as dist
        import torch

        from engines import _lazy_format as fmt

        group, size = self.dp_group, self.dp_size
        small: list = [None, None, None]  # header, remainder, error
        if self.dp_rank == 0:
            try:
                header = fmt.read_header(path)
                fmt.check_parts(path, header)
                small = [header, (path / header["remainder"]).read_bytes(), None]
            except (OSError, ValueError) as exc:
                small = [None, None, f"{type(exc).__name__}: {exc}"]
        dist.broadcast_object_list(small, src=dist.get_global_rank(group, 0), group=group)
        header, remainder, error = small
        if error:
            raise OSError(f"{path}: data-parallel replica 0 could not read it for the group: {error}")
        buffers = [fmt.aligned_empty(p["bytes"]) for p in header["parts"]]
        mine = [k for k in range(len(buffers)) if k % size == self.dp_rank]
        failed = None
        try:
            with ThreadPoolExecutor(self.options.readers) as pool:
                for k in mine:
                    fmt.read_into(path / header["parts"][k]["file"], buffers[k], pool, direct=self.options.direct_io)
        except OSError as exc:
            failed = exc
        ok = torch.tensor([0 if failed else 1], dtype=torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if failed:
            raise failed
        if not ok.item():
            raise OSError(f"{path}: another data-parallel replica could not read its part of it (its own error "
                          "is in its log)")
        for k, buf in enumerate(buffers):
            dist.broadcast(buf, src=dist.get_global_rank(group, k % size), group=group)
        read = sum(buffers[k].numel() for k in mine) + (len(remainder) if self.dp_rank == 0 else 0)
        self.load_stats["read_bytes"] += read
        self.load_stats["broadcast_bytes"] += sum(b.numel() for b in buffers) + len(remainder) - read
        self.load_stats["broadcast_loads"] += 1
        return header, remainder, buffers

    def preserves_storage_sharing(self):
        return False  # each view's own elements are copied: no defensive clone needed

    def is_data_parallel_writer(self, dp_rank):
        return dp_rank == 0 or (self.options.balance and self.dp_size > 1)


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
