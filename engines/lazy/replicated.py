"""engine=lazy's loads of a file replicated over the data-parallel replicas (a pp=1 run's model weights): read
into one shared-memory mapping by the replicas of one node, broadcast over the group once each replica has read its
share, or read by every replica, as broadcast_load and the measured bandwidths say (policy.replicated_way)."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from pathlib import Path

from engines.lazy import MIB, Options
from engines.lazy.buffers import ALIGNMENT, HUGE_PAGE, aligned, aligned_empty
from engines.lazy.format import check_parts, read_header
from engines.lazy.policy import replicated_way
from engines.lazy.stats import Decision
from restart_harness.files.baseline import CEILING_REQUEST_BYTES
from restart_harness.rank_env import all_reduce

# the broadcast's bandwidth is measured with one broadcast of this many bytes (or the file's share, if smaller)
BROADCAST_PROBE_BYTES = 8 * MIB
SHM_DIR = Path("/dev/shm")  # POSIX shared memory's file system on Linux
SHM_HEADROOM = 0.5  # the shared way takes at most this fraction of the shared memory's free bytes
SHARED = Decision("shared", "shared: every data-parallel replica is on this node, so each read its own share into one "
                            "shared-memory mapping and all build their tensors on it (the file read once, nothing "
                            "broadcast or copied)")


class ReplicatedReads:
    """A rank's loads of replicated files, with its data-parallel group; `loader` reads (load.Loader)."""

    def __init__(self, loader, options: Options, data_parallel: tuple, read_mib_s_per_reader: float | None):
        self.loader, self.options, self.stats = loader, options, loader.stats
        self.dp_rank, self.dp_size, self.dp_group = data_parallel
        self.read_mib_s_per_reader = read_mib_s_per_reader  # the run's storage probe's, or None
        self.broadcast_mib_s: float | None = None  # measured once per restart

    def read(self, path: Path):
        """A replicated file, by broadcast_load's way: every replica reads it all (false), the broadcast (true), or
        (auto) shared memory where every replica is on this node, else each replica reads its own share and the
        group takes the way replicated_way() gives on the bandwidths measured. A replica that cannot read fails every
        replica with its reason."""
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
            decision, out = Decision("read", "broadcast_load=false"), self.loader.read(path, first=mine)
        elif out is None:
            buffers = [aligned_empty(p["bytes"]) for p in header["parts"]]
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
        import deepspeed.comm as dist

        small: list = [None, None, None, None]  # header, remainder, error, the shared mapping's file (or why not)
        if self.dp_rank == 0:
            try:
                header = read_header(path)
                check_parts(path, header)
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
        queued before the broadcast (the storage is not idle while it runs: docs/benchmarks.md) or behind the
        reads."""
        if way == "broadcast":  # part k from replica k % dp, through DeepSpeed's comm (the anatomy counts it as wait)
            import deepspeed.comm as dist

            self.loader.read_ahead(path)
            for k, buf in enumerate(buffers):
                self._group_broadcast(buf, dist.get_global_rank(self.dp_group, k % self.dp_size))
            self.stats.broadcast_bytes += self._count(buffers, remainder, mine)
            self.stats.broadcast_loads += 1
            return
        self.loader.submit(path, header, buffers, [k for k in range(len(buffers)) if k not in mine], ahead=True,
                           wait=True)
        self.stats.broadcast_bytes += self._count(buffers, remainder, range(len(buffers)))  # the remainder

    @functools.cached_property
    def on_node(self) -> bool:
        """Is every replica of the data-parallel group on this node? Asked of the group once per restart."""
        import socket

        import deepspeed.comm as dist

        hosts: list = [None] * self.dp_size
        dist.all_gather_object(hosts, socket.gethostname(), group=self.dp_group)
        return len(set(hosts)) == 1

    def _shared_read(self, path: Path, header: dict, remainder: bytes, shm: str, mine: list[int]):
        """The shared way: every replica maps the file replica 0 made in shared memory, replica 0 unlinks it once
        all have it mapped, each reads its own parts into it, and the tensors are views of the mapping. Returns
        ((header, remainder, buffers), None), or (None, why not) where some replica could not map it."""
        import mmap

        import torch

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
        (MiB/s; all-reduced: every replica gets the same), None where a share is too small to time (under 1 MiB). A
        replica that could not read fails every replica. then_ahead: the rank's own ZeRO file queued behind the
        share (its reads then share the storage with the share's: the bandwidth is not the storage's alone)."""
        started = time.perf_counter()
        failed = None
        try:
            self.loader.submit(path, header, buffers, mine, ahead=then_ahead, wait=True)
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
            decision.figures["read_mib_s_from"] = source
            decision.why += f"; the storage's figure from {source}"
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
        seconds = all_reduce([time.perf_counter() - start], "max", group)[0]
        self.broadcast_mib_s = nbytes / MIB / max(seconds, 1e-9)

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
