"""Files that are either whole or absent: temp file in the same directory, fsync, rename, fsync the directory; and
fsync of files a checkpoint engine wrote (exclusive files, folders and locks: files/exclusive.py)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path, flags: int = os.O_RDONLY | os.O_DIRECTORY) -> None:
    """fsync a directory (with flags=os.O_RDONLY: a file)."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_paths(paths: list[Path]) -> None:
    """fsync each file's data, then each directory that names one (so the names are durable too)."""
    for path in paths:
        fsync_dir(path, os.O_RDONLY)
    for d in sorted({Path(path).parent for path in paths}):
        fsync_dir(d)


def files_under(path: Path) -> list[Path]:
    """The regular files at path: the file itself, or every file below a directory (sharded engines)."""
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


def whole_temporary(path: Path, data: bytes, mode: int = 0o644) -> str:
    """data written whole and durable into a temporary file beside path (its name returned), for a rename or link."""
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes it private
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_bytes_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    tmp = whole_temporary(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    write_bytes_atomic(path, text.encode(), mode)


def write_json_atomic(path: Path, data: object) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> object:
    return json.loads(Path(path).read_text())
