"""Where the harness keeps what it can rebuild (JIT-built ops, storage baselines, the I/O counter library): RH_CACHE_DIR,
else $XDG_CACHE_HOME/restart-harness, else ~/.cache/restart-harness; never inside the checkout."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ENV = "RH_CACHE_DIR"


def cache_dir(*parts: str) -> Path:
    """The cache folder (or a subfolder of it); not created here."""
    root = os.environ.get(ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "restart-harness"
    return Path(root).expanduser().joinpath(*parts)


def problem() -> str | None:
    """Why the cache folder (RH_CACHE_DIR where it is set) cannot be used, or None: it must be a folder this user can
    write, or one that can be created."""
    from restart_harness.files.fsfacts import why_not_a_directory

    return why_not_a_directory(cache_dir())


def extensions_dir() -> Path:
    """TORCH_EXTENSIONS_DIR for DeepSpeed's JIT-built ops: one folder per Python environment (an op's build flags
    name its environment's paths: two environments sharing a folder rebuild each other's ops, minutes each time)."""
    return cache_dir("torch_extensions", hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12])
