"""Ending a launch whole: every process of the launch's session is killed (a launcher may put ranks in process groups
of their own: Open MPI's mpiexec does). `python -m restart_harness.phases.session SID PARENT [FOLDER...]` is the
watchdog that does it when the harness dies, then removes the folders (a staged environment)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import time
from pathlib import Path


def members(sid: int, live: bool = False) -> list[int]:
    """Processes whose session is sid, zombies left out where `live` (from /proc/PID/stat: the fields after the
    command's closing parenthesis are state, ppid, pgrp, session, ...)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 3 and int(fields[3]) == sid and not (live and fields[0] == "Z"):
            out.append(int(entry.name))
    return out


def gone(sid: int, seconds: float) -> bool:
    """Wait up to `seconds` for session sid to have no live process (a killed one closes its files as it exits;
    zombies hold none); whether it has none."""
    deadline = time.monotonic() + seconds
    while True:
        live = [p for p in members(sid, live=True) if p != os.getpid()]
        if not live or time.monotonic() > deadline:
            return not live
        time.sleep(0.05)


def kill(sid: int) -> None:
    """SIGKILL every process of session sid (its leader's group first, then any group made inside it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for _ in range(5):  # a process forking while we kill: look again
        pids = [p for p in members(sid) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def watch(sid: int, parent: int, cleanup: list[str] | None = None) -> None:
    """Kill session sid when the harness (parent) dies: the kernel sends this process SIGTERM then
    (PR_SET_PDEATHSIG); then remove the `cleanup` folders."""

    since = time.time()  # the launch started just before this process

    def end(*_):
        try:
            kill(sid)
            gone(sid, 5)
            for folder in cleanup or []:
                shutil.rmtree(folder, ignore_errors=True)
            from restart_harness.files.cache_dir import extensions_dir
            from third_party.torch_extension_lock import remove_orphaned

            remove_orphaned(extensions_dir(), since - 5)  # a rank killed mid-build leaves its lock
        finally:
            os._exit(0)

    signal.signal(signal.SIGTERM, end)
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the harness died before the death signal was armed
        end()
    while True:
        signal.pause()


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
