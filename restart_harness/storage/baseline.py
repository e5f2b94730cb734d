"""Storage baseline: what the checkpoint file system does for plain sequential I/O, so a save or a load can be
read as a fraction of it.

One measurement: `ranks` writers each write one file of `file_bytes` in 4 MiB blocks and fsync it (write), the files
are evicted from the page cache with posix_fadvise(DONTNEED) and their residency read back with mincore (so the
record says whether the read was really cold), then `ranks` readers read them back (read). Throughput is total
bytes / the slowest writer's (reader's) seconds, in MiB/s: the MLPerf Storage definition the summary's checkpoint
throughput uses too. Tools: fio (psync engine, end_fsync=1, one job per rank; its job_runtime includes the fsync;
fallocate=none, because torch.save does not preallocate and fio's default posix_fallocate made writes ~9x slower on
ext4 here: unwritten extents converted at fsync) or a built-in probe (one thread per rank, os.write / os.fsync /
readinto; all release the GIL).

For an object store (an s3:// URL), the same shape with the client the engines use (s3torchconnector's checkpoint
streams): `ranks` threads each PUT one object of `file_bytes` (a multipart upload, complete when the write returns:
that is its durability), then GET it back whole; the objects are deleted afterwards. No page cache is involved.

Results are cached per host, file system (or endpoint and bucket), file size and rank count under the user cache
directory (storage/cache_dir.py: <cache>/baseline/), written atomically with the time and method.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from restart_harness.storage.atomic import write_json_atomic
from restart_harness.storage.cache_dir import cache_dir
from restart_harness.storage.filesystem import filesystem
from restart_harness.storage.pagecache import resident_total
from restart_harness.storage.s3 import S3Settings, S3Url, is_s3

MIB = 1 << 20
BLOCK_BYTES = 4 * MIB
TOOLS = ("auto", "fio", "builtin")
# The automatic probe before a run: bounded so it costs about a second, never minutes.
AUTO_MIN_FILE_BYTES = 16 * MIB  # fio reports whole milliseconds: smaller files would round to noise
AUTO_MAX_TOTAL_BYTES = 128 * MIB
AUTO_MAX_RANKS = 8
AUTO_MAX_FREE_FRACTION = 0.1
DEFAULT_FILE_BYTES = 64 * MIB


def cache_root() -> Path:
    return cache_dir("baseline")


def filesystem_key(directory: Path | str) -> str:
    """One folder per host and file system (or endpoint and bucket): the bandwidth is the storage's, not the
    folder's."""
    if is_s3(directory):
        url, settings = S3Url.parse(directory), S3Settings.from_environment()
        ident = f"{socket.gethostname()}|{settings.endpoint_url}|{settings.region}|{url.bucket}"
        return f"s3-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"
    fs = filesystem(directory)
    ident = f"{socket.gethostname()}|{fs['device']}|{fs['mount']}|{fs['type']}"
    return f"{fs['type'] or 'fs'}-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"


def cache_path(directory: Path, file_bytes: int, ranks: int) -> Path:
    return cache_root() / filesystem_key(directory) / f"{file_bytes}x{ranks}.json"


def cached(directory: Path, file_bytes: int | None = None, ranks: int | None = None) -> dict | None:
    """The cached baseline for directory's file system: the exact size and rank count if given and present, else
    the most recent measurement there (its file_bytes and ranks say what it was measured at)."""
    folder = cache_root() / filesystem_key(directory)
    if file_bytes is not None and ranks is not None:
        exact = folder / f"{file_bytes}x{ranks}.json"
        if exact.is_file():
            return _read(exact)
    if not folder.is_dir():
        return None
    entries = [e for e in (_read(p) for p in folder.glob("*.json")) if e]
    return max(entries, key=lambda e: e.get("measured_at", ""), default=None)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a damaged cache entry is measured again, never trusted


def fio_available() -> bool:
    return shutil.which("fio") is not None


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
    resident = resident_total(files)
    observed = ("cold" if resident == 0 else "warm" if resident >= total
                else f"partial ({resident / total:.0%} resident)")
    return {"method": "posix_fadvise_dontneed", "error": error, "resident_bytes_before_read": resident,
            "observed": observed}


def _threads(count: int, work) -> list[float]:
    """Run work(i) in `count` threads released together; each one's seconds from the common start."""
    barrier = threading.Barrier(count + 1)
    ends: list[float] = [0.0] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [e - start for e in ends]


def _builtin(files: list[Path], file_bytes: int) -> tuple[dict, dict, dict]:
    block = os.urandom(min(BLOCK_BYTES, file_bytes))  # random: no file system can compress it away

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

    write_s = _threads(len(files), write)
    cache = _evict(files)
    read_s = _threads(len(files), read)
    return _phase(files, file_bytes, write_s), _phase(files, file_bytes, read_s), cache


def _phase(files: list[Path], file_bytes: int, seconds: list[float]) -> dict:
    total = file_bytes * len(files)
    slowest = max(seconds)
    return {"bytes": total, "seconds": round(slowest, 6), "mib_s": round(total / MIB / slowest, 3) if slowest else None}


def _fio_run(workdir: Path, rw: str, file_bytes: int, ranks: int) -> dict:
    cmd = ["fio", "--name=rh-baseline", f"--directory={workdir}", f"--rw={rw}", f"--bs={min(BLOCK_BYTES, file_bytes)}",
           f"--size={file_bytes}", f"--numjobs={ranks}", "--ioengine=psync", "--fallocate=none",
           "--filename_format=rh.$jobnum",
           "--output-format=json"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise OSError(f"fio {rw} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    jobs = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"]
    total = sum(j[rw]["io_bytes"] for j in jobs)
    slowest = max(j["job_runtime"] for j in jobs) / 1000.0  # ms; includes end_fsync for writes
    return {"bytes": total, "seconds": round(slowest, 6), "mib_s": round(total / MIB / slowest, 3) if slowest else None}


def _fio(workdir: Path, files: list[Path], file_bytes: int) -> tuple[dict, dict, dict]:
    ranks = len(files)
    write = _fio_run(workdir, "write", file_bytes, ranks)
    cache = _evict(files)
    read = _fio_run(workdir, "read", file_bytes, ranks)  # fio also invalidates the files' cache itself
    return write, read, cache


def fio_version() -> str:
    proc = subprocess.run(["fio", "--version"], check=False, capture_output=True, text=True, timeout=30)
    return proc.stdout.strip()


def measure_object_store(where: str, file_bytes: int, ranks: int) -> dict:
    """PUT then GET `ranks` objects of file_bytes in parallel under the s3:// URL `where`; cache and return it."""
    from s3torchconnector import S3Checkpoint

    url, settings = S3Url.parse(where), S3Settings.from_environment()
    streams = S3Checkpoint(settings.region, endpoint=settings.endpoint_url, s3client_config=settings.client_config())
    scratch = url.child(f".rh-baseline-{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}")
    keys = [str(scratch.child(f"rh.{i}")) for i in range(ranks)]
    payload = os.urandom(min(BLOCK_BYTES, file_bytes))
    started = time.perf_counter()

    def put(i: int) -> None:
        left = file_bytes
        with streams.writer(keys[i]) as stream:
            while left:
                left -= stream.write(payload[:min(left, len(payload))])

    def get(i: int) -> None:
        got = 0
        with streams.reader(keys[i]) as stream:
            while block := stream.read(BLOCK_BYTES):
                got += len(block)
        if got != file_bytes:
            raise OSError(f"read {got} bytes of {keys[i]}, wrote {file_bytes}")

    try:
        write = _phase(keys, file_bytes, _threads(ranks, put))
        read = _phase(keys, file_bytes, _threads(ranks, get))
    finally:
        from restart_harness.storage.s3 import delete_all

        delete_all(scratch, settings)
    record = {
        "write_mib_s": write["mib_s"], "read_mib_s": read["mib_s"], "method": "s3torchconnector put/get",
        "tool": "s3", "file_bytes": file_bytes, "ranks": ranks, "block_bytes": len(payload), "dir": where,
        "filesystem": {"type": "s3", "device": settings.endpoint_url or f"AWS {settings.region}",
                       "mount": f"s3://{url.bucket}"},
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "probe_seconds": round(time.perf_counter() - started, 3), "write": write, "read": read,
        "read_cache": {"observed": "not applicable", "error": None},
    }
    path = cache_path(where, file_bytes, ranks)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return record


def measure(directory: Path, file_bytes: int, ranks: int, tool: str = "auto") -> dict:
    """Measure write (with fsync) and cold read in a temporary folder under directory; cache and return it."""
    if is_s3(directory):
        return measure_object_store(directory, file_bytes, ranks)
    directory = Path(directory).resolve()
    if tool == "auto":
        tool = "fio" if fio_available() else "builtin"
    workdir = directory / f".rh-baseline-{os.getpid()}-{int(time.time() * 1000)}"
    workdir.mkdir(parents=True)
    started = time.perf_counter()
    try:
        files = [workdir / f"rh.{i}" for i in range(ranks)]
        if tool == "fio":
            write, read, cache = _fio(workdir, files, file_bytes)
            method = fio_version() or "fio"
        else:
            write, read, cache = _builtin(files, file_bytes)
            method = "builtin"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    record = {
        "write_mib_s": write["mib_s"], "read_mib_s": read["mib_s"], "method": method, "tool": tool,
        "file_bytes": file_bytes, "ranks": ranks, "block_bytes": min(BLOCK_BYTES, file_bytes), "dir": str(directory),
        "filesystem": filesystem(directory),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "probe_seconds": round(time.perf_counter() - started, 3), "write": write, "read": read, "read_cache": cache,
    }
    path = cache_path(directory, file_bytes, ranks)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return record


def auto_size(typical_file_bytes: int, ranks: int, free_bytes: int) -> tuple[int, int] | None:
    """(file_bytes, ranks) for the automatic probe: the checkpoint's typical file and rank count, bounded so the
    probe stays around a second; None when the file system has too little free space to probe at all."""
    ranks = max(1, min(ranks, AUTO_MAX_RANKS))
    budget = min(AUTO_MAX_TOTAL_BYTES, int(free_bytes * AUTO_MAX_FREE_FRACTION))
    file_bytes = min(max(typical_file_bytes, AUTO_MIN_FILE_BYTES), budget // ranks)
    file_bytes -= file_bytes % 4096
    if file_bytes < AUTO_MIN_FILE_BYTES:
        return None
    return file_bytes, ranks


def summary_record(record: dict | None, cached_flag: bool) -> dict | None:
    """The summary.json `baseline` object."""
    if record is None:
        return None
    keys = ("write_mib_s", "read_mib_s", "method", "file_bytes", "ranks", "dir", "measured_at")
    out = {k: record.get(k) for k in keys}
    out["cached"] = cached_flag
    out["read_cache_observed"] = (record.get("read_cache") or {}).get("observed")
    if record.get("error"):
        out["error"] = record["error"]
    return out


def for_run(directory: Path, typical_file_bytes: int, ranks: int) -> dict:
    """The baseline a run records: the cached one for this file system, size and rank count, else a bounded
    measurement now. Never fails the run: a probe that cannot run is recorded with its error."""
    if is_s3(directory):
        free = AUTO_MAX_TOTAL_BYTES / AUTO_MAX_FREE_FRACTION  # a bucket has no free-space figure
    else:
        directory.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(directory).free
    size = auto_size(typical_file_bytes, ranks, free)
    if size is None:
        return {"error": "too little free space for a probe", "dir": str(directory), "cached": False}
    file_bytes, ranks = size
    hit = cached(directory, file_bytes, ranks)
    if hit and hit.get("file_bytes") == file_bytes and hit.get("ranks") == ranks:
        return summary_record(hit, True)
    try:
        return summary_record(measure(directory, file_bytes, ranks), False)
    except Exception as exc:  # noqa: BLE001 - includes the S3 client's errors; recorded, never fatal
        return {"error": f"{type(exc).__name__}: {exc}", "dir": str(directory), "cached": False}


def render(record: dict) -> str:
    cache, fs = record["read_cache"], record["filesystem"]
    where = cache_path(record["dir"] if is_s3(record["dir"]) else Path(record["dir"]), record["file_bytes"],
                       record["ranks"])
    objects = fs["type"] == "s3"
    return "\n".join([
        f"storage baseline of {record['dir']} (" + (f"object store at {fs['device']})" if objects else
                                                    f"{fs['type']} on {fs['device']}, mounted at {fs['mount']})"),
        (f"  method        {record['method']}, {record['ranks']} ranks x {record['file_bytes']} bytes, "
        f"{record['block_bytes']} byte blocks"),
        (f"  write_mib_s   {record['write_mib_s']}  (" + ("PUT until the upload completes" if objects else
                                                        "sequential write + fsync")
         + f"; slowest rank {record['write']['seconds']} s)"),
        f"  read_mib_s    {record['read_mib_s']}  (" + ("GET of each whole object" if objects else "sequential read")
        + f"; page cache before the read: {cache['observed']}" + (f", {cache['error']}" if cache["error"] else "")
        + ")",
        f"  measured_at   {record['measured_at']}; cached in {where}",
    ])
