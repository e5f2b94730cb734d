"""ckpt_dir=PATH (or none: the run directory's checkpoint/): a POSIX file system, local or parallel. Files are made
durable by fsync (file data, then the directories naming them), `latest` is written atomically (temporary file,
fsync, rename, fsync the folder), a restart's page cache is evicted and observed with mincore, and the baseline
probe is fio (psync, end_fsync) or a built-in one."""

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

from restart_harness.errors import RunFailed, UsageError
from restart_harness.files import baseline, pagecache
from restart_harness.files.atomic import files_under, fsync_paths, write_text_atomic
from restart_harness.files.exclusive import claim_dir
from restart_harness.files.fsfacts import filesystem, free_bytes, nearest_existing, why_not_a_directory
from restart_harness.targets.base import LATEST, NO_OBSERVER, POSIX, StorageProbe, Target, as_path

MIB = 1 << 20
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and most aarch64 kernels
FULL_DISK_BYTES = 1 << 20
IN_RUN = "checkpoint"  # the checkpoint folder inside a run directory (no ckpt_dir given)


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
        directory = self._probe_dir()
        directory.mkdir(parents=True, exist_ok=True)
        if tool == "auto":
            tool = "fio" if fio_available() else "builtin"
        workdir = directory / baseline.scratch_name()
        workdir.mkdir(parents=True)
        try:
            files = [workdir / f"rh.{i}" for i in range(ranks)]
            if tool == "fio":
                write, read, cache = _fio(workdir, files, file_bytes)
                method = fio_version() or "fio"
            else:
                write, read, cache = _builtin(files, file_bytes)
                method = "builtin"
            meta = metadata_probe(workdir / "meta", ranks)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return {"write": write, "read": read, "read_cache": cache, "metadata": meta, "method": method, "tool": tool,
                "dir": str(directory), "filesystem": filesystem(directory),
                "block_bytes": min(baseline.BLOCK_BYTES, file_bytes),
                "write_means": "sequential write + fsync", "read_means": "sequential read"}


    def measure_ceiling(self, file_bytes: int, ranks: int, tool: str) -> dict:
        """The ceiling's probe (files/baseline.py): each rank one file of file_bytes, written with O_DIRECT in
        requests of CEILING_REQUEST_BYTES, CEILING_QUEUE_DEPTH in flight, fsync'd; then read back the same way. The
        built-in probe (threads, each its own reused buffer), or with tool=fio
        fio's libaio at that iodepth. Where the file system refuses
        O_DIRECT, the same shape buffered, and `refused` says why. Then, evicted again, read once more in the same
        shape through the page cache (`read_buffered`; the built-in threads: a disk whose
        read-ahead beats O_DIRECT reads fastest so)."""
        directory = self._probe_dir()
        directory.mkdir(parents=True, exist_ok=True)
        # the engine's own shape unless fio is asked for: on this project's disk O_DIRECT reads in threads ran at
        # 1,523 MiB/s where fio's libaio at the same depth and request size gave 1,098 (medians of 5, interleaved,
        # 2026-11-27): a ceiling below what an engine reads is no ceiling
        tool = "fio" if tool == "fio" else "builtin"
        request, depth = min(baseline.CEILING_REQUEST_BYTES, file_bytes), baseline.CEILING_QUEUE_DEPTH
        workdir = directory / baseline.scratch_name()
        workdir.mkdir(parents=True)
        try:
            files = [workdir / f"rh.{i}" for i in range(ranks)]
            if tool == "fio":
                write, read, cache, refused = _fio_direct(workdir, files, file_bytes, request, depth)
                method = f"{fio_version() or 'fio'} libaio"
            else:
                write, read, cache, refused = _builtin_direct(files, file_bytes, request, depth)
                method = "builtin threads"
            read_buffered = None
            if refused is None:  # refused: the read above was already buffered
                read_buffered = _builtin_direct(files, file_bytes, request, depth, write_too=False, direct=False)[1]
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        how = f"{'buffered' if refused else 'O_DIRECT'}, {request // MIB} MiB requests x {depth} in flight a rank"
        return {"write": write, "read": read, "read_cache": cache, "method": method, "tool": tool,
                "request_bytes": request, "queue_depth": depth, "o_direct": refused is None, "refused": refused,
                "write_means": f"{how}, fsync at the end", "read_means": how, "read_buffered": read_buffered,
                "read_buffered_means": f"buffered, {request // MIB} MiB requests x {depth} threads a rank (built-in)"}


class FileSystemTarget(Target):
    name = "filesystem"
    kind = POSIX
    description = "a file system (local or parallel): files, fsync, atomic rename"
    probe_class = FileSystemProbe

    def __init__(self, location: str | None, root: Path | None = None, observer=NO_OBSERVER, results_dir=None):
        super().__init__(location, root, observer)
        self.results_dir = Path(results_dir) if results_dir is not None else None

    @classmethod
    def claims(cls, location: str | None) -> bool:
        return location is None or "://" not in str(location)

    @classmethod
    def for_location(cls, location, results_dir):
        return cls(location, results_dir=results_dir)

    def _base(self) -> Path:
        """Where a run's checkpoint folder would be made: ckpt_dir, or the results folder."""
        return Path(self.location or self.results_dir or ".").expanduser()

    def preflight(self, key: str, need_bytes: int | None, reach: bool = True) -> None:
        if self.location:
            reason = why_not_a_directory(Path(self.location))
            if reason:
                raise UsageError(f"{key}={self.location}: {reason}")
        if need_bytes:
            where = nearest_existing(self._base())
            free = free_bytes(where)
            if need_bytes > free:
                raise UsageError(f"the checkpoints need {need_bytes / MIB:,.1f} MiB (planned) but the file system "
                                 f"holding {where} has {free / MIB:,.1f} MiB free; give ckpt_dir= on a larger one, or "
                                 "fewer saves (iters, save_interval)")

    # ---- one run -------------------------------------------------------------------------------------------------
    def placed(self, run_dir: Path) -> FileSystemTarget:
        """The run's checkpoint folder: inside its run directory, or under ckpt_dir claimed by mkdir (a fresh name
        where another run's folder of that name is there: two runs never share one, files/exclusive.py)."""
        if not self.location:
            return FileSystemTarget(None, run_dir / IN_RUN, self.observer)
        try:
            root = claim_dir(Path(self.location).expanduser().resolve(), run_dir.name)
        except OSError as exc:
            raise RunFailed(f"ckpt_dir={self.location}: cannot claim a checkpoint folder there: {exc}") from None
        return FileSystemTarget(self.location, root, self.observer)

    def record(self, run_dir: Path) -> dict:
        inside = self.root.relative_to(run_dir).as_posix() if self.root.is_relative_to(run_dir) else None
        return {"checkpoint_target": self.name, "checkpoint_run": run_dir.name, "checkpoint_root": str(self.root),
                "checkpoint_root_in_run": inside, "checkpoint_data_in_run": inside is not None}

    @classmethod
    def from_record(cls, record: dict, root: Path, observer=NO_OBSERVER) -> FileSystemTarget:
        return cls(None, root, observer)

    # ---- checkpoint data -----------------------------------------------------------------------------------------
    def destination(self, path, mode):
        return as_path(path)

    def dcp_writer(self, path):
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(str(path))

    def dcp_reader(self, path):
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(str(path))

    def make_durable(self, paths) -> None:
        fsync_paths([f for p in paths for f in files_under(Path(p))])

    def size(self, path) -> int:
        return sum(f.stat().st_size for f in files_under(Path(path)))

    def exists(self, path) -> bool:
        return Path(path).exists()

    def commit_latest(self, tag: str) -> None:
        write_text_atomic(self.root / LATEST, tag)

    def latest(self) -> str | None:
        path = self.root / LATEST
        return path.read_text().strip() if path.is_file() else None

    def missing(self) -> str | None:
        return None if self.root.is_dir() else f"checkpoint directory {self.root} is missing"

    def listing(self) -> dict[str, list[tuple[str, int]]]:
        if not self.root.is_dir():
            return {}
        out = {}
        for tag_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            out[tag_dir.name] = [(f.relative_to(tag_dir).as_posix(), f.stat().st_size) for f in files_under(tag_dir)]
        return out

    def delete(self) -> str:
        if self.root.is_dir():
            shutil.rmtree(self.root)
        return str(self.root)

    def prepare_cache(self, tag_dir: Path, requested: str, per_file: bool = False) -> dict:
        return pagecache.prepare(files_under(tag_dir), requested, per_file)

    def explain_save_failure(self, exc: BaseException, tag: str) -> BaseException:
        """torch.save reports a full disk as 'unexpected pos ...' from its zip writer: name the real cause."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            return exc
        if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or free < FULL_DISK_BYTES:
            return OSError(errno.ENOSPC, f"No space left on device while saving {tag}: {free} bytes free on the "
                                         f"checkpoint filesystem at {self.root} ({type(exc).__name__}: {exc})")
        return exc

# ---- probes ------------------------------------------------------------------------------------------------------
METADATA_FILES = 500  # per rank, as mdtest's -n: files each rank creates, stats, opens and removes


def metadata_probe(folder: Path, ranks: int, files: int = METADATA_FILES) -> dict:
    """mdtest's shape on one node: `ranks` threads, each in a folder of its own, create `files` empty files, then stat
    them, open and close them, remove them; each step's operations over its wall time, all ranks together
    (operations per second). The rates of a file system's metadata service as this node's clients see them (a
    client's caches included: the stats and opens follow the creates, as an import's do not)."""
    folders = [folder / f"rank-{r}" for r in range(ranks)]
    for f in folders:
        f.mkdir(parents=True)
    names = [[str(f / f"f.{i}") for i in range(files)] for f in folders]

    def create(paths: list[str]) -> None:
        for path in paths:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))

    def opened(paths: list[str]) -> None:
        for path in paths:
            os.close(os.open(path, os.O_RDONLY))

    def stat(paths: list[str]) -> None:
        for path in paths:
            os.stat(path)

    def remove(paths: list[str]) -> None:
        for path in paths:
            os.unlink(path)

    out: dict = {"ranks": ranks, "files_per_rank": files}
    with ThreadPoolExecutor(max_workers=ranks) as pool:
        for step, fn in (("create", create), ("stat", stat), ("open", opened), ("remove", remove)):
            start = time.perf_counter()
            list(pool.map(fn, names))
            seconds = time.perf_counter() - start
            out[f"{step}_per_s"] = round(ranks * files / seconds, 1) if seconds > 0 else None
    return out


def fio_available() -> bool:
    return shutil.which("fio") is not None


def fio_version() -> str:
    proc = subprocess.run(["fio", "--version"], check=False, capture_output=True, text=True, timeout=30)
    return proc.stdout.strip()


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


def _builtin(files: list[Path], file_bytes: int) -> tuple[dict, dict, dict]:
    """One thread per rank: os.write in 4 MiB blocks then os.fsync; evict; readinto (all release the GIL)."""
    block = os.urandom(min(baseline.BLOCK_BYTES, file_bytes))  # random: no file system can compress it away

    def write(i: int) -> None:
        fd = os.open(files[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = file_bytes
            while left:
                left -= os.write(fd, block[: min(left, len(block))])
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(i: int) -> None:
        buf = bytearray(len(block))
        with open(files[i], "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    write_s = baseline.threads(len(files), write)
    cache = _evict(files)
    read_s = baseline.threads(len(files), read)
    return (baseline.phase(file_bytes * len(files), write_s), baseline.phase(file_bytes * len(files), read_s),
            cache)


def _fio_run(workdir: Path, rw: str, file_bytes: int, ranks: int, options: tuple[str, ...] = ()) -> dict:
    """fio's psync engine (or `options`' engine and shape), one job per rank; fallocate=none, because torch.save does
    not preallocate and fio's default posix_fallocate made writes ~9x slower on ext4 here (unwritten extents converted
    at fsync)."""
    cmd = ["fio", "--name=rh-baseline", f"--directory={workdir}", f"--rw={rw}",
           f"--bs={min(baseline.BLOCK_BYTES, file_bytes)}", f"--size={file_bytes}", f"--numjobs={ranks}",
           "--ioengine=psync", "--fallocate=none", "--filename_format=rh.$jobnum", "--output-format=json", *options]
    if rw == "write":
        cmd.append("--end_fsync=1")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise OSError(f"fio {rw} exited {proc.returncode}: {' '.join(proc.stderr.strip().splitlines()[-3:])}")
    jobs = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"]
    total = sum(j[rw]["io_bytes"] for j in jobs)
    slowest = max(j["job_runtime"] for j in jobs) / 1000.0  # ms; includes end_fsync for writes
    return {"bytes": total, "seconds": round(slowest, 6), "mib_s": round(total / MIB / slowest, 3) if slowest else None}


def _fio_direct(workdir: Path, files: list[Path], file_bytes: int, request: int,
                depth: int) -> tuple[dict, dict, dict, str | None]:
    """The ceiling's fio jobs (later options override the baseline's): libaio, `depth` requests of `request` bytes in
    flight a job, O_DIRECT; buffered where fio reports that the file system refuses it."""
    shape = ("--ioengine=libaio", f"--iodepth={depth}", f"--bs={request}")
    try:
        write = _fio_run(workdir, "write", file_bytes, len(files), (*shape, "--direct=1"))
        direct, refused = "--direct=1", None
    except OSError as exc:
        if "Invalid argument" not in str(exc) and "direct" not in str(exc):
            raise
        for f in workdir.iterdir():
            f.unlink()
        refused = f"O_DIRECT refused: {exc}"
        direct = "--direct=0"
        write = _fio_run(workdir, "write", file_bytes, len(files), (*shape, direct))
    cache = _evict(files)
    read = _fio_run(workdir, "read", file_bytes, len(files), (*shape, direct))
    return write, read, cache, refused


def _open_direct(path: Path, flags: int) -> tuple[int, str | None]:
    """path opened with O_DIRECT, or without it where the file system answers EINVAL (and why)."""
    try:
        return os.open(path, flags | os.O_DIRECT, 0o644), None
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return os.open(path, flags, 0o644), f"O_DIRECT refused: {exc.strerror} (EINVAL)"


def _builtin_direct(files: list[Path], file_bytes: int, request: int, depth: int,
                    write_too: bool = True, direct: bool = True) -> tuple[dict | None, dict, dict, str | None]:
    """Each rank `depth` threads, each reusing one page-aligned buffer of `request` bytes, taking every depth-th
    request of its file (whole 4 KiB blocks, the padding cut off by ftruncate): pwrite, one fsync a file; evict;
    preadv the same way. write_too=False: only read them (evicted first); direct=False: through the page cache."""
    padded = -(-file_bytes // 4096) * 4096
    offsets = list(range(0, padded, request))
    payload = os.urandom(request)  # random: no file system can compress it away
    refusals: list[str] = []

    def run(i: int, write: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY
        fd, why = _open_direct(files[i], flags) if direct else (os.open(files[i], flags, 0o644), None)
        if why:
            refusals.append(why)

        def stream(t: int) -> None:
            # in 2 MiB pages where the kernel gives them, as an engine's large buffers may be:
            # an O_DIRECT request's pages are its scatter-gather list, and 4 KiB ones split a 16 MiB request
            buf = mmap.mmap(-1, request + HUGE_PAGE)
            with contextlib.suppress(AttributeError, OSError):  # no MADV_HUGEPAGE: 4 KiB pages
                buf.madvise(mmap.MADV_HUGEPAGE)
            anchor = ctypes.c_char.from_buffer(buf)
            shift = -ctypes.addressof(anchor) % HUGE_PAGE
            del anchor  # an exported pointer would keep the mapping from closing
            whole = memoryview(buf)
            view = whole[shift:shift + request]
            if write:
                view[:] = payload
            try:
                for off in offsets[t::depth]:
                    n = min(request, padded - off)
                    done = 0
                    while done < n:
                        step = (os.pwrite(fd, view[done:n], off + done) if write
                                else os.preadv(fd, [view[done:n]], off + done))
                        if step <= 0:
                            break  # the end of the file
                        done += step
            finally:
                view.release()
                whole.release()
                buf.close()

        try:
            with ThreadPoolExecutor(max_workers=depth) as pool:
                list(pool.map(stream, range(depth)))
            if write:
                if padded != file_bytes:
                    os.ftruncate(fd, file_bytes)
                os.fsync(fd)
        finally:
            os.close(fd)

    total = file_bytes * len(files)
    write_s = baseline.threads(len(files), lambda i: run(i, True)) if write_too else None
    cache = _evict(files)
    read_s = baseline.threads(len(files), lambda i: run(i, False))
    return (baseline.phase(total, write_s) if write_s else None, baseline.phase(total, read_s), cache,
            (refusals[0] if refusals else None))


def _fio(workdir: Path, files: list[Path], file_bytes: int) -> tuple[dict, dict, dict]:
    ranks = len(files)
    write = _fio_run(workdir, "write", file_bytes, ranks)
    cache = _evict(files)
    read = _fio_run(workdir, "read", file_bytes, ranks)  # fio also invalidates the files' cache itself
    return write, read, cache
