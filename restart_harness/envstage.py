"""env_stage=FOLDER: the restart's ranks run from a copy of the Python environment (sys.prefix) made in FOLDER just
before they start; what is copied, what it costs and why JIT-built ops are rebuilt in the copy: docs/restart-io.md.
The copy is removed when the restart ends, whatever its outcome; a watchdog removes it if the harness is killed
while the ranks run, and a copy left by a harness killed while copying is removed by the next staging into the same
folder (its folder name carries the dead harness's process id)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from restart_harness.errors import RunFailed, UsageError
from restart_harness.files.cache_dir import extensions_dir
from restart_harness.files.fsfacts import filesystem

PREFIX = "rh-env-"
MARGIN = 1.1  # free space wanted beyond the copy's size


@dataclass(frozen=True)
class Staged:
    folder: Path  # removed whole when the restart ends
    python: str  # the copy's interpreter (what the launch script runs)
    prefix: str  # the copy's sys.prefix
    extensions: str  # the copy's TORCH_EXTENSIONS_DIR
    record: dict  # seconds, bytes, files, folder, filesystem: the restart's `staging`


def _size(root: Path) -> tuple[int, int]:
    """Bytes and files under root (links not followed: the copy keeps them as links)."""
    total = files = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            total += st.st_size
    return total, files


def sources() -> tuple[Path, Path]:
    """The environment and the extension cache this harness's ranks use."""
    return Path(sys.prefix), extensions_dir()


def check(folder: str | Path, nodes: int = 1, submits: bool = False, room: bool = True) -> None:
    """env_stage= before anything is launched: a folder that exists and is writable, with room for the copy (`room`:
    not for a dry run, which copies nothing), a virtual environment to copy, and ranks started on this node."""
    where = Path(folder).expanduser()
    key = f"env_stage={folder}"
    if nodes > 1 or submits:
        raise UsageError(f"{key}: staging copies the environment on this node only; accepted with nodes=1 and a "
                         "launcher that starts the ranks here (local, torchrun, mpiexec, prefork)")
    if not where.is_dir():
        raise UsageError(f"{key}: no such folder (accepted: an existing folder, e.g. node-local storage or /dev/shm)")
    try:  # by trying: root passes access() on a read-only mount or /proc
        fd, probe = tempfile.mkstemp(dir=where, prefix=".rh-stage-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{key}: not writable ({exc.strerror or exc})") from None
    env, _ = sources()
    if sys.prefix == sys.base_prefix or not Path(sys.executable).absolute().is_relative_to(env.absolute()):
        raise UsageError(f"{key}: the harness runs in {sys.prefix}, not a virtual environment it can copy "
                         "(accepted: a venv, as ./submit-job.sh makes)")
    if not room:
        return
    need = _size(env)[0]
    free = shutil.disk_usage(where).free
    if free < need * MARGIN:
        raise UsageError(f"{key}: {free / 2**30:.2f} GiB free, the environment ({env}) needs "
                         f"{need / 2**30:.2f} GiB (+10%)")


def _sweep(where: Path) -> None:
    """Copies left by harnesses that were killed while copying (their process is gone)."""
    for old in where.glob(f"{PREFIX}*"):
        pid = old.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)


def stage(folder: str | Path, name: str) -> Staged:
    """Copy the environment and the extension cache into folder/rh-env-<pid>-<name>/ and time it."""
    where = Path(folder).expanduser().absolute()
    _sweep(where)
    dest = where / f"{PREFIX}{os.getpid()}-{name}"
    env = sources()[0]
    start = time.perf_counter()
    try:
        dest.mkdir()
        cp = shutil.which("cp")
        if cp:  # coreutils' copy: several times faster than shutil's on tens of thousands of small files
            subprocess.run([cp, "-a", str(env), str(dest / "env")], check=True, capture_output=True, text=True)
        else:
            shutil.copytree(env, dest / "env", symlinks=True)
        (dest / "torch_extensions").mkdir()  # JIT-built ops are built here again (docs/restart-io.md says why)
        os.sync()  # the copy is on the storage, as a staged environment would be before a job starts
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise RunFailed(f"env_stage={folder}: copying {env} failed: {exc.stderr.strip()[-300:]}") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    seconds = time.perf_counter() - start
    nbytes, files = _size(dest)
    relative = Path(sys.executable).absolute().relative_to(env.absolute())  # check() made sure it is inside
    fs = filesystem(dest)
    return Staged(dest, str(dest / "env" / relative), str(dest / "env"), str(dest / "torch_extensions"),
                  {"folder": str(dest), "seconds": round(seconds, 3), "bytes": nbytes, "files": files,
                   "filesystem": {"mount": fs.get("mount"), "type": fs.get("type")}})


def remove(staged: Staged | None) -> None:
    if staged is not None:
        shutil.rmtree(staged.folder, ignore_errors=True)
