"""Inventory of one checkpoint tag: every file (or object), its bytes, its kind and its writing rank."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from restart_harness.results.schema import KINDS, classify


def files_of(tag_dir: Path) -> list[tuple[str, int]]:
    """(path relative to tag_dir, bytes) of every file below a tag directory."""
    return [(p.relative_to(tag_dir).as_posix(), p.stat().st_size) for p in tag_dir.rglob("*") if p.is_file()]


def build(tag_dir: Path | str, writers: dict[str, int] | None = None,
          entries: list[tuple[str, int]] | None = None) -> dict:
    """writers maps a DeepSpeed path (relative to the tag) to the rank whose engine.save() wrote it; entries: the
    (path, bytes) of an object store's listing of the tag (tag_dir is then its s3:// URL), else the tag directory's
    files."""
    writers = writers or {}
    files = []
    for rel, nbytes in sorted(files_of(Path(tag_dir)) if entries is None else entries):
        top = rel.split("/", 1)[0]
        files.append({"path": rel, "bytes": nbytes, "kind": classify(rel), "rank": writers.get(rel, writers.get(top))})
    by_kind = {k: {"files": 0, "bytes": 0} for k in KINDS}
    by_rank: dict = defaultdict(lambda: {"files": 0, "bytes": 0})
    for f in files:
        by_kind[f["kind"]]["files"] += 1
        by_kind[f["kind"]]["bytes"] += f["bytes"]
        key = "unknown" if f["rank"] is None else str(f["rank"])
        by_rank[key]["files"] += 1
        by_rank[key]["bytes"] += f["bytes"]
    return {
        "dir": str(tag_dir) if entries is not None else str(Path(tag_dir).resolve()),
        "files": files,
        "total_files": len(files),
        # DeepSpeed files: one per engine.save() path, whether a file or a directory of shards (torchsnapshot, dcp)
        "total_entries": len({f["path"].split("/", 1)[0] for f in files}),
        "total_bytes": sum(f["bytes"] for f in files),
        "by_kind": by_kind,
        "by_rank": dict(sorted(by_rank.items(), key=lambda kv: (kv[0] == "unknown", int(kv[0]) if kv[0].isdigit() else 0))),
    }
