"""engine=lazy's load pipeline: every part read into one preallocated buffer by `readers` threads in parallel
requests, tensors built as views of it; the rank's own ZeRO file read ahead while DeepSpeed takes in the first file
of the tag. A file replicated over the data-parallel replicas (a pp=1 run's model weights) is read into one
shared-memory mapping by the replicas of one node, broadcast over the group once each replica has read its share, or
read by every replica, as broadcast_load and the measured bandwidths say (policy.replicated_way)."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepspeed.comm as dist
import torch
import torch.distributed as tdist

from engines.lazy import MIB, REPLICATED, Options
from engines.lazy.buffers import ALIGNMENT, HUGE_PAGE, Reads, aligned, aligned_empty
from engines.lazy.format import check_parts, is_lazy, read_header
from engines.lazy.format import load as load_file
from engines.lazy.policy import Decision, LoadStats, load_pages, per_rank, read_way, replicated_way
from restart_harness.files.baseline import CEILING_REQUEST_BYTES
from restart_harness.files.kernel_memory import free_page_reporting_order
from restart_harness.rank_env import all_reduce

# the broadcast's bandwidth is measured with one broadcast of this many bytes (or the file's share, if smaller)
BROADCAST_PROBE_BYTES = 8 * MIB
SHM_DIR = Path("/dev/shm")  # POSIX shared memory's file system on Linux
SHM_HEADROOM = 0.5  # the shared way takes at most this fraction of the shared memory's free bytes
SHARED = Decision("shared", "shared: every data-parallel replica is on this node, so each read its own share into one "
                            "shared-memory mapping and all build their tensors on it (the file read once, nothing "
                            "broadcast or copied)")


class Loader:
    """A rank's restart loads, a replicated file's with its data-parallel group."""

    def __init__(self, options: Options, storage: dict | None, ds_engine, data_parallel: tuple):
        self.options, self.ds_engine = options, ds_engine  # ds_engine: DeepSpeed's, to name the own ZeRO file
        self.pool = ThreadPoolExecutor(options.readers, thread_name_prefix="lazy-read")
        self.stats = LoadStats(read_io=read_way(options, storage))
        self.read_direct = self.stats.read_io.way == "direct"
        self.stats.pages = load_pages(self.read_direct, free_page_reporting_order())
        self.huge_pages = self.stats.pages.way == "huge"
        self.submitted: list = []  # every file read (buffers.Reads): its requests and those populated ahead
        self.last_read: dict = {}  # the buffers of the last file loaded: a second load of it reads nothing
        self.prefetch: dict = {}  # path -> (header, buffers, reads) of a file read ahead
        self.prefetch_tags: set = set()
        self.dp_rank, self.dp_size, self.dp_group = data_parallel
        self.read_mib_s_per_reader = per_rank(storage, "read_mib_s")  # the run's storage probe's, or None
        self.broadcast_mib_s: float | None = None  # measured once per restart

    def statistics(self) -> dict:
        return self.stats.as_dict(self.submitted)

    def buffer(self, nbytes: int):
        """A part's load buffer, in the pages policy.load_pages chose."""
        return aligned_empty(nbytes, huge_pages=self.huge_pages)

    def load(self, path: str, map_location=None):
        if is_lazy(path):
            shared = self.dp_size > 1 and self.dp_group is not None and REPLICATED.search(path)
            reader = self.read_replicated if shared else self.read
            return load_file(path, map_location=map_location, reuse=self.last_read, reader=reader)
        return torch.load(path, map_location=map_location, weights_only=False)

    def read(self, path: Path, first: list[int] | None = None):
        """The file's parts read here (the parts in `first` queued first), the rank's own ZeRO file queued behind
        them; or, where it was read ahead, what is left of that."""
        ahead = self.prefetch.pop(str(path), None)
        if ahead is not None:  # read ahead while an earlier file was loaded: wait for what is left of it
            header, buffers, reads = ahead
            for r in reads:
                r.wait()
            check_parts(path, header)
        else:
            header = read_header(path)
            buffers = [self.buffer(p["bytes"]) for p in header["parts"]]
            first = first or []
            self.submit(path, header, buffers, [*first, *(k for k in range(len(buffers)) if k not in first)],
                        ahead=True, wait=True)
        remainder = (path / header["remainder"]).read_bytes()
        self.stats.read_bytes += sum(b.numel() for b in buffers) + len(remainder)
        return header, remainder, buffers

    def submit(self, path: Path, header: dict, buffers: list, parts, ahead: bool = False, wait: bool = False) -> list:
        """The parts' reads queued (buffers.Reads); ahead: the rank's own ZeRO file queued behind them (read_ahead);
        wait: until they are done."""
        reads = [Reads(path / header["parts"][k]["file"], buffers[k], self.pool, self.read_direct,
                       chunk=self.options.read_chunk_mib * MIB) for k in parts]
        self.submitted += reads
        if ahead:
            self.read_ahead(path)
        if wait:
            for r in reads:
                r.wait()
        return reads

    def read_ahead(self, path: Path) -> None:
        """Once per tag, once the first file's own requests are queued: this rank's own ZeRO file, queued behind them
        (docs/engines.md#enginelazy)."""
        if path.parent in self.prefetch_tags:
            return
        self.prefetch_tags.add(path.parent)
        engine, tag = self.ds_engine, path.parent
        try:  # this rank's own ZeRO file, named by DeepSpeed's own function (the one its load reads)
            own = (None if engine is None or not engine.zero_optimization() or engine.zero_elastic_checkpoint()
                   else Path(engine._get_zero_ckpt_name(str(tag.parent), tag.name)))
        except (AttributeError, TypeError, ValueError):
            return
        if own is None or own == path or not is_lazy(own):
            return
        try:
            header = read_header(own)
        except (OSError, ValueError):
            return  # its own load will say what is wrong with it
        buffers = [self.buffer(p["bytes"]) for p in header["parts"]]
        self.prefetch[str(own)] = (header, buffers, self.submit(own, header, buffers, range(len(buffers))))
        self.stats.prefetched_bytes += sum(b.numel() for b in buffers)

    def read_replicated(self, path: Path):
        """A replicated file, by broadcast_load's way (docs/engines.md#enginelazy); a replica that cannot read fails
        every replica with its reason."""
        choice = self.options.broadcast_load
        on_node = choice == "auto" and self.on_node
        header, remainder, shm = self._small_files(path, on_node)
        start = time.perf_counter()
        mine = [k for k in range(len(header["parts"])) if k % self.dp_size == self.dp_rank]
        out, decision = None, None
        if shm and shm.get("file"):
            out, why_not = self._shared_read(path, header, remainder, shm["file"], mine)
            decision, shm = (SHARED, shm) if out is not None else (None, {"why_not": why_not})
        if out is None and choice == "false":
            decision, out = Decision("read", "broadcast_load=false"), self.read(path, first=mine)
        elif out is None:
            buffers = [self.buffer(p["bytes"]) for p in header["parts"]]
            reader_mib_s = self._read_share(path, header, buffers, mine)
            if choice == "true":
                decision = Decision("broadcast", "broadcast_load=true")
            else:
                decision = self._decide(sum(p["bytes"] for p in header["parts"]), reader_mib_s)
                if on_node:
                    decision.why += f"; not shared memory: {(shm or {}).get('why_not')}"
            self._the_rest(decision.way, header, remainder, buffers, mine, path)
            out = header, remainder, buffers
        self.stats.replicated.append({"file": path.name, **decision.as_dict(),
                                      "seconds": round(time.perf_counter() - start, 6)})
        return out

    def _small_files(self, path: Path, on_node: bool) -> tuple[dict, bytes, dict | None]:
        """The header and the remainder, read by replica 0 and broadcast to the group, with the shared mapping
        replica 0 made for them (on_node; or why not); a replica 0 that could not read them fails every replica."""
        small: list = [None, None, None, None]  # header, remainder, error, the shared mapping's file (or why not)
        if self.dp_rank == 0:
            try:
                header = read_header(path)
                small[:2] = header, (path / header["remainder"]).read_bytes()
                if on_node:
                    small[3] = shm_create(shm_layout(header)[1])
            except (OSError, ValueError) as exc:
                small[2] = f"{type(exc).__name__}: {exc}"
        dist.broadcast_object_list(small, src=dist.get_global_rank(self.dp_group, 0), group=self.dp_group)
        header, remainder, error, shm = small
        if error:
            raise OSError(f"{path}: data-parallel replica 0 could not read it for the group: {error}")
        return header, remainder, shm

    def _the_rest(self, way: str, header: dict, remainder: bytes, buffers: list, mine: list[int], path: Path):
        """Once this replica's share is read: the other shares broadcast, or read here, the rank's own ZeRO file
        queued before the broadcast or behind the reads."""
        if way == "broadcast":  # part k from replica k % dp, through DeepSpeed's comm (the anatomy counts it as wait)
            self.read_ahead(path)
            for k, buf in enumerate(buffers):
                self._group_broadcast(buf, dist.get_global_rank(self.dp_group, k % self.dp_size))
            self.stats.broadcast_bytes += self._count(buffers, remainder, mine)
            self.stats.broadcast_loads += 1
            return
        self.submit(path, header, buffers, [k for k in range(len(buffers)) if k not in mine], ahead=True, wait=True)
        self.stats.broadcast_bytes += self._count(buffers, remainder, range(len(buffers)))  # the remainder

    @functools.cached_property
    def on_node(self) -> bool:
        """Is every replica of the data-parallel group on this node? Asked of the group once per restart."""
        hosts: list = [None] * self.dp_size
        dist.all_gather_object(hosts, socket.gethostname(), group=self.dp_group)
        return len(set(hosts)) == 1

    def _shared_read(self, path: Path, header: dict, remainder: bytes, shm: str, mine: list[int]):
        """The shared way (docs/engines.md#enginelazy): ((header, remainder, buffers), None), or (None, why not)
        where some replica could not map replica 0's file in shared memory."""
        offsets, total = shm_layout(header)
        mapped, why = None, None
        try:
            with open(shm, "r+b") as f:
                if os.fstat(f.fileno()).st_size != total:
                    raise OSError(f"{shm}: {os.fstat(f.fileno()).st_size} bytes, {total} expected")
                mapped = mmap.mmap(f.fileno(), total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            why = f"replica {self.dp_rank} could not map {shm}: {exc.strerror or exc}"
        everyone = all_reduce([0.0 if mapped is None else 1.0], "min", self.dp_group)[0]
        if self.dp_rank == 0:
            with contextlib.suppress(OSError):
                os.unlink(shm)
        if not everyone:
            return None, why or "another replica could not map the shared memory (its log says why)"
        whole = torch.frombuffer(mapped, dtype=torch.uint8)  # keeps the mapping alive as long as a view of it
        buffers = [whole[o:o + p["bytes"]] for o, p in zip(offsets, header["parts"], strict=True)]
        self._read_share(path, header, buffers, mine, then_ahead=True)
        self.stats.shared_bytes = (self.stats.shared_bytes or 0) + self._count(buffers, remainder, mine)
        return (header, remainder, buffers), None

    def _read_share(self, path: Path, header: dict, buffers: list, mine: list[int],
                    then_ahead: bool = False) -> float | None:
        """This replica's parts of a replicated file; returns the slowest replica's read bandwidth of its share
        (MiB/s, all-reduced), None under 1 MiB. then_ahead: the rank's own ZeRO file queued behind the share."""
        started = time.perf_counter()
        failed = None
        try:
            self.submit(path, header, buffers, mine, ahead=then_ahead, wait=True)
        except OSError as exc:
            failed = exc
        seconds = time.perf_counter() - started
        share = sum(buffers[k].numel() for k in mine)
        rate = share / MIB / seconds if share >= MIB and seconds > 0 else -1.0
        read, slowest = all_reduce([0.0 if failed else 1.0, rate], "min", self.dp_group)
        if failed:
            raise failed
        if not read:
            raise OSError(f"{path}: another data-parallel replica could not read its part of it (its own error "
                          "is in its log)")
        return slowest if slowest > 0 else None

    def _decide(self, file_bytes: int, reader_mib_s: float | None) -> Decision:
        """broadcast_load=auto, once this replica's share is read: replicated_way() on the bandwidths measured now
        (docs/engines.md#enginelazy)."""
        source = "the group's own share reads just now"
        if reader_mib_s is None:
            reader_mib_s, source = self.read_mib_s_per_reader, "the run's storage probe (the shares were too small)"
        if reader_mib_s:
            self._measure_broadcast(file_bytes)
        decision = replicated_way(file_bytes, self.dp_size, self.broadcast_mib_s, reader_mib_s)
        if reader_mib_s:
            decision.figures["read_mib_s_from"] = source
            decision.why += f"; the storage's figure from {source}"
        return decision

    def _measure_broadcast(self, file_bytes: int) -> None:
        """The broadcast's bandwidth over the data-parallel group (MiB/s), once per restart: one timed broadcast of
        a share's size (1 MiB to BROADCAST_PROBE_BYTES), its slowest replica's seconds."""
        if self.broadcast_mib_s is not None:
            return
        group = self.dp_group
        nbytes = max(MIB, min(BROADCAST_PROBE_BYTES, file_bytes // self.dp_size))
        buf = torch.zeros(nbytes, dtype=torch.uint8)
        dist.barrier(group=group)
        start = time.perf_counter()
        self._group_broadcast(buf, dist.get_global_rank(group, 0))
        self.broadcast_mib_s = nbytes / MIB / max(all_reduce([time.perf_counter() - start], "max", group)[0], 1e-9)

    def _group_broadcast(self, buf, src: int) -> None:
        """A host buffer broadcast over the data-parallel group: directly where its backend takes host tensors
        (gloo), through a device buffer a request's worth at a time where it does not (NCCL)."""
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

    def _count(self, buffers: list, remainder: bytes, read: list[int] | range) -> int:
        """The parts in `read` (and replica 0's remainder) counted as read here; returns the bytes of the rest."""
        here = sum(buffers[k].numel() for k in read) + (len(remainder) if self.dp_rank == 0 else 0)
        self.stats.read_bytes += here
        return sum(b.numel() for b in buffers) + len(remainder) - here


def shm_layout(header: dict) -> tuple[list[int], int]:
    """Where each part of a file goes in its shared mapping: at 2 MiB boundaries, each with room for its O_DIRECT
    padding; and the mapping's size."""
    offsets, at = [], 0
    for part in header["parts"]:
        offsets.append(at)
        at += aligned(aligned(part["bytes"]), HUGE_PAGE)
    return offsets, max(at, ALIGNMENT)


def shm_create(nbytes: int) -> dict:
    """A file of nbytes in shared memory for the group to map ({"file": path}), or why not ({"why_not": ...}):
    no /dev/shm, or too little of it free (a container's is often 64 MiB)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError as exc:
        return {"why_not": f"{SHM_DIR}: {exc.strerror or exc}"}
    free = stat.f_bavail * stat.f_frsize
    if nbytes > free * SHM_HEADROOM:
        return {"why_not": f"{SHM_DIR} has {free / MIB:,.0f} MiB free, the file needs {nbytes / MIB:,.0f} MiB (at most "
                           f"{SHM_HEADROOM:.0%} of it is taken)"}
    fd, path = tempfile.mkstemp(prefix=f"rh-lazy-{os.getpid()}-", dir=SHM_DIR)
    try:
        os.ftruncate(fd, nbytes)
    except OSError as exc:
        os.unlink(path)
        return {"why_not": f"{path}: {exc.strerror or exc}"}
    finally:
        os.close(fd)
    return {"file": path}
