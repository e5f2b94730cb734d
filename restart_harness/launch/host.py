"""Facts about the software and the machine, recorded in spec.json (no torch import: package metadata)."""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from pathlib import Path


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def filesystem(path: Path) -> dict:
    """Mount point, type and device of the filesystem holding path (longest /proc/mounts prefix)."""
    path = path.resolve()
    best = {"mount": "/", "type": None, "device": None}
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best["mount"]):
                best = {"mount": mount, "type": fstype, "device": device}
    except OSError:
        pass
    return best


def facts(ckpt_root: Path) -> dict:
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "deepspeed": _version("deepspeed"),
            "restart_harness": __import__("restart_harness").__version__,
        },
        "host": {
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "memory_bytes": mem,
            "user_is_root": os.geteuid() == 0,
        },
        "checkpoint_filesystem": filesystem(ckpt_root),
    }
