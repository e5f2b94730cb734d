"""Content checksums of checkpoint files (checksums=, docs/measurements.md#checksums): the writing rank's sha256 of
each committed file (a folder of shards: its files' relative paths and contents, in path order), checked before a
restart loads it."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from restart_harness.files.atomic import files_under

ALGORITHM = "sha256"
_CHUNK = 8 << 20


class Mismatch(ValueError):
    """A recorded file whose content is not what was committed (str: one line naming it)."""


def of(path: str | Path) -> str:
    """sha256 (hex) of a file's content, or of a folder of shards."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_dir():
        for f in files_under(path):
            digest.update(str(f.relative_to(path)).encode() + b"\0")
            _feed(digest, f)
    else:
        _feed(digest, path)
    return digest.hexdigest()


def _feed(digest, path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])


def compare(tag_dir: Path, recorded: dict[str, dict]) -> dict | None:
    """Check every recorded file of one checkpoint (relative path -> {bytes, sha256}) under tag_dir; Mismatch names the
    first that differs. What was checked ({algorithm, files, bytes, seconds}), or None: no checksums recorded."""
    checked = {rel: r for rel, r in sorted(recorded.items()) if r.get(ALGORITHM)}
    if not checked:
        return None
    start = time.perf_counter()
    for rel, r in checked.items():
        if of(tag_dir / rel) != r[ALGORITHM]:
            raise Mismatch(f"{tag_dir / rel}: content differs from the {ALGORITHM} recorded when {tag_dir.name} was "
                           f"committed ({r['bytes']} bytes either way: torn, a region never written or overwritten)")
    return {"algorithm": ALGORITHM, "files": len(checked), "bytes": sum(r["bytes"] for r in checked.values()),
            "seconds": round(time.perf_counter() - start, 6)}
