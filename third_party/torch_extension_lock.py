"""torch 2.13.0's `torch.utils.file_baton.FileBaton`, the lock of a JIT extension build (DeepSpeed's
`deepspeed_shm_comm` op, built by the first CPU run, about a minute on 2 cores), waits forever on a lock file whose
builder was killed (Ctrl-C or a killed job during that first build): every later run then hangs in
`init_distributed`, silently, with no rank past `imports_done`. Found here when a test run was killed mid-build.

remove_stale() deletes such a lock before any rank starts: one that no process on this host holds open (FileBaton
keeps the descriptor it created the file with open for the whole build) and that is older than STALE_SECONDS (a
build on another node sharing the cache folder is younger than that). remove_orphaned() deletes, once a launch the
harness ended (or that failed) is gone, the locks created during it that no process holds open: its own ranks' (a
rank killed mid-build: Ctrl-C, a time limit, launcher=prefork ending the others when one fails), so runs started
beside it and waiting on that lock go on at once instead of until a later run's preflight finds it STALE_SECONDS old
(in CI a test that interrupts a launch during the first build held every concurrent run for 10 to 17 minutes). Remove when FileBaton stops waiting on a lock
whose owner is gone (tests/test_spec.py::test_torch_file_baton_still_waits_on_an_ownerless_lock fails then).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ADDRESSES = "torch==2.13.0"
STALE_SECONDS = 600


def _held_open(path: Path) -> bool:
    """Does any process on this host have `path` open (its /proc/<pid>/fd links)?"""
    target = str(path.resolve())
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if os.readlink(fd) == target:
                    return True
        except OSError:  # processes come and go; others' fds may be unreadable
            continue
    return False


def remove_stale(extensions_dir: Path, now: float | None = None) -> list[Path]:
    """The build locks under extensions_dir that nothing holds and that are older than STALE_SECONDS, removed."""
    now = time.time() if now is None else now
    removed = []
    for lock in Path(extensions_dir).glob("*/lock"):
        try:
            old = now - lock.stat().st_mtime > STALE_SECONDS
        except FileNotFoundError:
            continue
        if old and not _held_open(lock):
            lock.unlink(missing_ok=True)
            removed.append(lock)
    return removed


def remove_orphaned(extensions_dir: Path, since: float) -> list[Path]:
    """The build locks under extensions_dir created at or after `since` (a launch's start) that nothing on this host
    holds open, removed: called once that launch's processes are gone."""
    removed = []
    for lock in Path(extensions_dir).glob("*/lock"):
        try:
            fresh = lock.stat().st_mtime >= since - 1
        except FileNotFoundError:
            continue
        if fresh and not _held_open(lock):
            lock.unlink(missing_ok=True)
            removed.append(lock)
    return removed
