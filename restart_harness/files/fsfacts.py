"""Facts about the file system that holds a path, and whether a directory can be created there; no harness imports."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

# File systems that hold no data: a checkpoint or a result written there is lost or refused.
PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
                                "tracefs", "configfs", "fusectl", "mqueue", "pstore", "bpf", "binfmt_misc",
                                "hugetlbfs", "autofs", "efivarfs", "nsfs"})


def filesystem(path: Path) -> dict:
    """Mount point, type and device of the file system holding path (longest /proc/mounts prefix)."""
    path = Path(path).resolve()
    best = {"mount": "/", "type": None, "device": None}
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best["mount"]):
                best = {"mount": mount, "type": fstype, "device": device}
    return best


NAME_MAX = 255  # bytes of one component of a path (Linux's NAME_MAX): a longer one is ENAMETOOLONG at first use
PATH_MAX = 4095  # bytes of a whole path


def why_too_long(text: str | Path) -> str | None:
    """Why a path is too long for the file system as written (pure: the machine is not asked), or None: every
    component at most NAME_MAX bytes, the whole at most PATH_MAX."""
    raw = os.fsencode(str(text))
    if len(raw) > PATH_MAX:
        return f"a path of {len(raw):,} bytes; accepted: a path of at most {PATH_MAX:,} bytes"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        shown = longest[:16].decode(errors="replace")
        return (f"a path component of {len(longest):,} bytes ({shown}...); accepted: components (folder and file "
                f"names) of at most {NAME_MAX} bytes")
    return None


def why_unresolvable(text: str | Path) -> str | None:
    """Why a path cannot be used as it is written (the home of a user who does not exist, a loop of symbolic links, a
    name too long), or None. Every path a user gives is checked with this before anything is created."""
    if why := why_too_long(text):
        return why
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~name of no such user
        return f"no user {str(text).split('/')[0][1:]!r} on this machine, so {str(text).split('/')[0]} has no home"
    if why := why_too_long(path):  # ~ expanded: a home of long names
        return why
    try:
        path.resolve()
    except RuntimeError:  # Python 3.11: "Symlink loop from ..."
        return "a loop of symbolic links: it leads nowhere"
    except OSError as exc:
        return f"cannot be followed ({exc.strerror or exc})"
    return None


def nearest_existing(path: Path) -> Path:
    """path itself, or its closest ancestor that exists."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(nearest_existing(path)).free


def why_not_a_directory(path: Path) -> str | None:
    """None when path is a directory that can be written, or one that can be created; else the reason, one line.
    Proven: a temporary directory is made in the nearest existing ancestor (os.access says yes to root on /proc)."""
    if why := why_unresolvable(path):
        return why
    # the path as it will be used, `..` and symlinks resolved: relative/ckpt/../../../../proc/x is /proc/x
    path = Path(os.path.realpath(Path(path).expanduser()))
    base = nearest_existing(path)  # "/" at the latest
    if not base.is_dir():
        return f"{base} exists and is not a directory"
    fs = filesystem(base)
    if fs["type"] in PSEUDO_FILESYSTEMS:
        return f"{base} is on a {fs['type']} file system (mounted at {fs['mount']}), which holds no files"
    try:
        probe = tempfile.mkdtemp(prefix=".rh-probe-", dir=base)
        os.rmdir(probe)
    except OSError as exc:
        return f"cannot create directories in {base} ({exc.strerror or exc})"
    return None
