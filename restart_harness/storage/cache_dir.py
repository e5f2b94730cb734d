"""Where the harness keeps what it can rebuild (DeepSpeed's JIT-built ops, storage baselines, the I/O counter
library): RH_CACHE_DIR, else $XDG_CACHE_HOME/restart-harness, else ~/.cache/restart-harness. Never inside the
checkout, so a read-only install works."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "RH_CACHE_DIR"


def cache_dir(*parts: str) -> Path:
    """The cache folder (or a subfolder of it); not created here."""
    root = os.environ.get(ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "restart-harness")
    return Path(root).expanduser().joinpath(*parts)
