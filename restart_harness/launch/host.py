"""Facts about the software and the machine, recorded in spec.json (no torch import: package metadata)."""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from pathlib import Path

import restart_harness
from restart_harness.storage.filesystem import filesystem


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


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
            "restart_harness": restart_harness.__version__,
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
