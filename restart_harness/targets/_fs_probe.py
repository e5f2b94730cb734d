"""The storage baseline's probe of a file system (FileSystemTarget.storage_probe(); files/baseline.py times, caches
and renders it): the baseline (fio's psync or the built-in probe: sequential write, fsync, evict, sequential read),
the ceiling (O_DIRECT: fio's libaio or the built-in threads, an engine's own shape) and the metadata rates (mdtest's
shape), each in a scratch folder beside the run's checkpoint folder, each read after its files are evicted."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import mmap
import os
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.files import baseline, pagecache
from restart_harness.files.fsfacts import filesystem, free_bytes, nearest_existing, why_not_a_directory
from restart_harness.targets.base import StorageProbe

MIB = 1 << 20
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and most aarch64 kernels
METADATA_FILES = 500  # per rank, as mdtest's -n: files each rank creates, stats, opens and removes


class FileSystemProbe(StorageProbe):
    """The storage baseline of a file system: fio or the built-in probe, beside the run's checkpoint folder."""

    def check(self, key: str) -> None:
        """The baseline measures a folder that exists (it is not created)."""
        d = Path(self.target.location)
        if not d.is_dir():
            raise UsageError(f"{key}={self.target.location}: no such directory")
        if not os.access(d, os.W_OK) or why_not_a_directory(d):
            raise UsageError(f"{key}={self.target.location}: not writable")

    def _probe_dir(self) -> Path:
        """Where a probe writes: beside the run's checkpoint folder, or the location itself."""
        return (self.target.root.parent if self.target.root is not None else self.target._base()).resolve()

    def key(self) -> str:
        fs = filesystem(nearest_existing(self._probe_dir()))
        ident = f"{socket.gethostname()}|{fs['device']}|{fs['mount']}|{fs['type']}"
        return f"{fs['type'] or 'fs'}-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"

    def free_bytes(self) -> int:
        return free_bytes(self._probe_dir())

    def measure(self, file_bytes: int, ranks: int, tool: str) -> dict:
        if tool == "auto":
            tool = "fio" if shutil.which("fio") else "builtin"
        block, directory = min(baseline.BLOCK_BYTES, file_bytes), self._probe_dir()
        with _scratch(directory, ranks) as (workdir, files):
            if tool == "fio":  # write + fsync, evict, read (fio also invalidates the cache)
                write, cache = _fio_run(workdir, "write", file_bytes, ranks), _evict(files)
                read = _fio_run(workdir, "read", file_bytes, ranks)
                version = subprocess.run(["fio", "--version"], check=False, capture_output=True, text=True, timeout=30)
                method = version.stdout.strip() or "fio"
            else:
                write, read, cache, _ = _builtin(files, file_bytes, block, 1, direct=False)
                method = "builtin"
            meta = metadata_probe(workdir / "meta", ranks)
        return {"write": write, "read": read, "read_cache": cache, "metadata": meta, "method": method, "tool": tool,
                "dir": str(directory), "filesystem": filesystem(directory), "block_bytes": block,
                "write_means": "sequential write + fsync", "read_means": "sequential read"}

    def measure_ceiling(self, file_bytes: int, ranks: int, tool: str) -> dict:
        """The ceiling's probes (files/baseline.py). The engine's own shape, always: each rank one file of
        file_bytes, written with O_DIRECT by CEILING_QUEUE_DEPTH threads in requests of CEILING_REQUEST_BYTES (each
        its own reused buffer), fsync'd, read back the same way (where the file system refuses O_DIRECT, buffered,
        and `refused` says why), then read once more through the page cache (`read_buffered`): the two ways
        engine=lazy chooses between. With tool=fio, also fio's grid (`grid`: fio_grid()); where fio cannot do
        direct I/O there, `grid_refused` says why and the grid is left out."""
        request, depth = min(baseline.CEILING_REQUEST_BYTES, file_bytes), baseline.CEILING_QUEUE_DEPTH
        with _scratch(self._probe_dir(), ranks) as (workdir, files):
            write, read, cache, refused = _builtin(files, file_bytes, request, depth)
            read_buffered = None
            if refused is None:  # refused: the read above was already buffered
                read_buffered = _builtin(files, file_bytes, request, depth, write_too=False, direct=False)[1]
            for f in files:
                f.unlink()
            grid, grid_refused = fio_grid(workdir, file_bytes, ranks) if tool == "fio" else (None, None)
        how = f"{'buffered' if refused else 'O_DIRECT'}, {request // MIB} MiB requests x {depth} in flight a rank"
        return {"write": write, "read": read, "read_cache": cache, "method": "builtin threads", "tool": "builtin",
                "request_bytes": request, "queue_depth": depth, "o_direct": refused is None, "refused": refused,
                "write_means": f"{how}, fsync at the end", "read_means": how, "read_buffered": read_buffered,
                "read_buffered_means": f"buffered, {request // MIB} MiB requests x {depth} threads a rank (built-in)",
                "grid": grid, "grid_refused": grid_refused, "file_bytes": file_bytes}


# fio's grid (issue 67): (request bytes, requests in flight a job, jobs a rank), O_DIRECT with libaio, spanning the
# engines' own shapes: torch.save's 4 MiB-ish writes deep, engine=lazy's 16 MiB x 4 a rank, deeper and wider
FIO_GRID = ((4 * MIB, 16, 1), (16 * MIB, 4, 1), (16 * MIB, 32, 1), (16 * MIB, 8, 2), (64 * MIB, 8, 1))


def fio_grid(workdir: Path, file_bytes: int, ranks: int) -> tuple[list[dict] | None, str | None]:
    """Each FIO_GRID shape: `ranks` x jobs fio jobs write file_bytes a rank in all (O_DIRECT, libaio, fsync at the
    end), evicted, read back cold the same way. (the shapes' rows, None) or (None, why fio cannot do direct I/O here:
    fio missing, or the file system refusing O_DIRECT)."""
    if shutil.which("fio") is None:
        return None, "fio is not installed"
    rows = []
    for request, depth, jobs in FIO_GRID:
        size = file_bytes // jobs // 4096 * 4096
        shape = ("--ioengine=libaio", f"--iodepth={depth}", f"--bs={min(request, size)}", "--direct=1")
        try:
            write = _fio_run(workdir, "write", size, ranks * jobs, shape)
        except OSError as exc:
            return None, f"fio cannot do direct I/O in {workdir.parent}: {str(exc)[:200]}"
        files = [workdir / f"rh.{i}" for i in range(ranks * jobs)]
        cache = _evict(files)
        read = _fio_run(workdir, "read", size, ranks * jobs, shape)
        for f in files:
            f.unlink()
        rows.append({"request_bytes": request, "queue_depth": depth, "jobs_per_rank": jobs,
                     "write_mib_s": write["mib_s"], "read_mib_s": read["mib_s"], "read_cache": cache["observed"]})
    return rows, None


@contextlib.contextmanager
def _scratch(directory: Path, ranks: int):
    """A fresh folder in directory with one file name a rank, removed afterwards."""
    workdir = directory / baseline.scratch_name()
    workdir.mkdir(parents=True)
    try:
        yield workdir, [workdir / f"rh.{i}" for i in range(ranks)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def metadata_probe(folder: Path, ranks: int, files: int = METADATA_FILES) -> dict:
    """mdtest's shape on one node: `ranks` threads, each in a folder of its own, create `files` empty files, then stat
    them, open and close them, remove them; each step's operations over its wall time, all ranks together
    (operations per second). The rates of a file system's metadata service as this node's clients see them (a
    client's caches included: the stats and opens follow the creates, as an import's do not)."""
    folders = [folder / f"rank-{r}" for r in range(ranks)]
    for f in folders:
        f.mkdir(parents=True)
    names = [[str(f / f"f.{i}") for i in range(files)] for f in folders]
    steps = (("create", lambda path: os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))),
             ("stat", os.stat), ("open", lambda path: os.close(os.open(path, os.O_RDONLY))), ("remove", os.unlink))
    out: dict = {"ranks": ranks, "files_per_rank": files}
    with ThreadPoolExecutor(max_workers=ranks) as pool:
        for step, fn in steps:
            start = time.perf_counter()
            list(pool.map(lambda paths, fn=fn: [fn(path) for path in paths], names))
            seconds = time.perf_counter() - start
            out[f"{step}_per_s"] = round(ranks * files / seconds, 1) if seconds > 0 else None
    return out


def _evict(files: list[Path]) -> dict:
    """Drop these files' pages (clean after fsync) and report what mincore then sees."""
    total = sum(f.stat().st_size for f in files)
    error = None
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            error = f"posix_fadvise: {exc.strerror or exc}"
        finally:
            os.close(fd)
    resident = pagecache.resident_total(files)
    observed = ("cold" if resident == 0 else "warm" if resident >= total
                else f"partial ({resident / total:.0%} resident)")
    return {"method": "posix_fadvise_dontneed", "error": error, "resident_bytes_before_read": resident,
            "observed": observed}


# ---- fio ---------------------------------------------------------------------------------------------------------
def _fio_run(workdir: Path, rw: str, file_bytes: int, ranks: int, options: tuple[str, ...] = ()) -> dict:
    """fio's psync engine (or `options`' engine and shape), one job per rank; fallocate=none, as torch.save
    (docs/planner.md)."""
    cmd = ["fio", "--name=rh-baseline", f"--directory={workdir}", f"--rw={rw}",
           f"--bs={min(baseline.BLOCK_BYTES, file_bytes)}", f"--size={file_bytes}", f"--numjobs={ranks}",
           "--ioengine=psync", "--fallocate=none", "--filename_format=rh.$jobnum", "--output-format=json", *options]
    if rw == "write":
        cmd.append("--end_fsync=1")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise OSError(f"fio {rw} exited {proc.returncode}: {' '.join(proc.stderr.strip().splitlines()[-3:])}")
    jobs = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"]
    # the slowest job's runtime (ms; with end_fsync for writes)
    return baseline.phase(sum(j[rw]["io_bytes"] for j in jobs), [max(j["job_runtime"] for j in jobs) / 1000.0])


# ---- the built-in probe ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _aligned_buffer(request: int):
    """A reused buffer of `request` bytes in transparent huge pages where the kernel gives them, as an engine's kept
    buffers are (engine=lazy's staging): an O_DIRECT request's pages are its scatter-gather list, so scattered 4 KiB
    pages cut it short (a virtio disk takes 254 segments a request: about 1 MiB of them against 4 MiB of contiguous
    memory, half the pace on this project's machine; docs/measurements.md). Private: an anonymous shared mapping is
    shmem, which THP leaves out unless shmem_enabled says otherwise."""
    buf = mmap.mmap(-1, request + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no MADV_HUGEPAGE: 4 KiB pages
        buf.madvise(mmap.MADV_HUGEPAGE)
    anchor = ctypes.c_char.from_buffer(buf)
    shift = -ctypes.addressof(anchor) % HUGE_PAGE
    del anchor  # an exported pointer would keep the mapping from closing
    whole = memoryview(buf)
    view = whole[shift:shift + request]
    try:
        yield view
    finally:
        view.release()
        whole.release()
        buf.close()


def _stream(fd: int, offsets: list[int], end: int, view: memoryview, write: bool) -> None:
    """One thread's requests of one file through its buffer: pwrite what it holds at each offset (or preadv into
    it) up to `end`."""
    request = len(view)
    for off in offsets:
        n = min(request, end - off)
        done = 0
        while done < n:
            step = os.pwrite(fd, view[done:n], off + done) if write else os.preadv(fd, [view[done:n]], off + done)
            if step <= 0:
                break  # the end of the file
            done += step


def _builtin(files: list[Path], file_bytes: int, request: int, depth: int,
             write_too: bool = True, direct: bool = True) -> tuple[dict | None, dict, dict, str | None]:
    """Each rank `depth` threads, each reusing one page-aligned buffer of `request` bytes (filled, so faulted in,
    before any clock starts: a fresh huge page can wait for compaction, no part of the storage's pace), taking every
    depth-th request of its file (O_DIRECT: whole 4 KiB blocks, the padding cut off by ftruncate): pwrite, one fsync
    a file; evict; preadv the same way (all release the GIL). write_too=False: only read them (evicted first);
    direct=False: through the page cache (the baseline: one thread a rank, 4 MiB requests)."""
    padded = -(-file_bytes // 4096) * 4096 if direct else file_bytes
    payload = os.urandom(request)  # random: no file system can compress it away
    refusals: list[str] = []

    def run(i: int, write: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY
        try:  # O_DIRECT, or without it where the file system answers EINVAL (and why)
            fd = os.open(files[i], flags | (os.O_DIRECT if direct else 0), 0o644)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            fd = os.open(files[i], flags, 0o644)
            refusals.append(f"O_DIRECT refused: {exc.strerror} (EINVAL)")
        try:
            offsets = range(0, padded, request)
            with ThreadPoolExecutor(max_workers=depth) as pool:
                list(pool.map(lambda t: _stream(fd, offsets[t::depth], padded, views[i][t], write), range(depth)))
            if write:
                if padded != file_bytes:
                    os.ftruncate(fd, file_bytes)
                os.fsync(fd)
        finally:
            os.close(fd)

    total = file_bytes * len(files)
    with contextlib.ExitStack() as buffers:
        views = [[buffers.enter_context(_aligned_buffer(request)) for _ in range(depth)] for _ in files]
        for view in (v for row in views for v in row):
            view[:] = payload
        write_s = baseline.threads(len(files), lambda i: run(i, True)) if write_too else None
        cache = _evict(files)
        read_s = baseline.threads(len(files), lambda i: run(i, False))
    return (baseline.phase(total, write_s) if write_s else None, baseline.phase(total, read_s), cache,
            (refusals[0] if refusals else None))
