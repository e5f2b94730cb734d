"""Nothing that exists is ever replaced or shared: a file is created exclusively (a hard link of a whole temporary
file), a folder claimed by mkdir (a fresh name on collision), and work that continues an existing folder holds its
lock (flock; a second one is refused naming the holder)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from restart_harness.files.atomic import fsync_dir, whole_temporary

LOCK = ".lock"


def taken(path: Path | str) -> str | None:
    """Why an output file the command will create cannot be (anything is there now), or None."""
    exists = os.path.lexists(Path(path).expanduser())
    return "already exists (nothing is overwritten); accepted: a new file's path" if exists else None


def create_file(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """path written whole and exclusively: FileExistsError if it appeared meanwhile (nothing replaced)."""
    path = Path(path)
    tmp = whole_temporary(path, data, mode)
    try:
        os.link(tmp, path)  # fails where path exists: the exclusive create
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return path


def create_json(path: Path, data: object) -> Path:
    return create_file(path, (json.dumps(data, indent=2) + "\n").encode())


def claim_dir(root: Path, base: str) -> Path:
    """Create root/base, or root/base-2, -3, ... if taken; mkdir is the claim, so two processes never share one."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = root / (base if n == 1 else f"{base}-{n}")
        with contextlib.suppress(FileExistsError):
            path.mkdir()
            return path.resolve()
    raise FileExistsError(f"could not create a fresh directory {base} under {root}: 999 taken")


_held: dict[str, int] = {}  # folder -> the lock file's descriptor, open (so held) until this process ends


def hold(folder: Path) -> str | None:
    """This process holds folder's lock until it ends (or release()): None; else why not (the holder named: its pid,
    host and start time), for the caller's one-line refusal."""
    folder = Path(folder).resolve()
    if str(folder) in _held:
        return None
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        return f"cannot lock {folder}: {exc.strerror}; accepted: a folder this user can write"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace")
        os.close(fd)
        return (f"{folder} is in use by {_holder(holder)}; accepted: wait for it to end (its lock is freed when that "
                "process ends)")
    os.ftruncate(fd, 0)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.pwrite(fd, json.dumps(info).encode(), 0)
    _held[str(folder)] = fd
    return None


def release(folder: Path) -> None:
    fd = _held.pop(str(Path(folder).resolve()), None)
    if fd is not None:
        os.close(fd)


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} (started {info['started']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
