"""A command run as on a node without libaio: in a mount namespace of its own where overlays of /usr/include and
/usr/lib/<arch> carry whiteouts of libaio's header and libraries (the machine itself keeps them; root only). The
compiler, the linker and the dynamic loader then find no libaio, as on the GPU node where DeepSpeed's async_io op
could not build (2026-11-26)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

import pytest

INCLUDE = Path("/usr/include")
LIBDIR = Path("/usr/lib") / (sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
HIDDEN = {INCLUDE: ["libaio.h"], LIBDIR: ["libaio.a", "libaio.so", "libaio.so.1", "libaio.so.1.0.2"]}


def run(command: str, tmp: Path, env: dict | None = None, cwd: Path | None = None,
        timeout: int = 300) -> subprocess.CompletedProcess:
    """bash -c command, with libaio hidden; skipped (failed under CI=true) where namespaces cannot be made."""
    mounts = []
    for i, (where, names) in enumerate(HIDDEN.items()):
        upper, work = tmp / f"upper{i}", tmp / f"work{i}"
        upper.mkdir(parents=True)
        work.mkdir()
        for name in names:
            os.mknod(upper / name, 0o600 | 0o020000, os.makedev(0, 0))  # an overlay whiteout: a 0/0 char device
        mounts.append(f"mount -t overlay overlay -o lowerdir={where},upperdir={upper},workdir={work} {where}")
    script = " && ".join(mounts) + f" && {command}"
    probe = subprocess.run(["unshare", "-m", "bash", "-c", " && ".join(mounts) + " && true"], capture_output=True,
                           text=True, check=False)
    if probe.returncode != 0:
        why = f"cannot hide libaio in a mount namespace here: {probe.stderr.strip()[-300:]}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must not skip: {why}")
        pytest.skip(why)
    return subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, check=False,
                          env=env, cwd=cwd, timeout=timeout)


def quoted(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in args)
