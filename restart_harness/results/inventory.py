"""Inventory of one checkpoint tag directory: every file, its bytes, its kind and its writing rank."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from restart_harness.results.schema import KINDS, classify


def build(tag_dir: Path, writers: dict[str, int] | None = None) -> dict:
    """writers maps a DeepSpeed path (relative to tag_dir) to the rank whose engine.save() wrote it."""
    writers = writers or {}
    files = []
    for path in sorted(p for p in tag_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(tag_dir).as_posix()
        top = rel.split("/", 1)[0]
        files.append({"path": rel, "bytes": path.stat().st_size, "kind": classify(rel),
                      "rank": writers.get(rel, writers.get(top))})
    by_kind = {k: {"files": 0, "bytes": 0} for k in KINDS}
    by_rank: dict = defaultdict(lambda: {"files": 0, "bytes": 0})
    for f in files:
        by_kind[f["kind"]]["files"] += 1
        by_kind[f["kind"]]["bytes"] += f["bytes"]
        key = "unknown" if f["rank"] is None else str(f["rank"])
        by_rank[key]["files"] += 1
        by_rank[key]["bytes"] += f["bytes"]
    return {
        "dir": str(tag_dir.resolve()),
        "files": files,
        "total_files": len(files),
        # DeepSpeed files: one per engine.save() path, whether a file or a directory of shards (torchsnapshot, dcp)
        "total_entries": len({f["path"].split("/", 1)[0] for f in files}),
        "total_bytes": sum(f["bytes"] for f in files),
        "by_kind": by_kind,
        "by_rank": dict(sorted(by_rank.items(), key=lambda kv: (kv[0] == "unknown", int(kv[0]) if kv[0].isdigit() else 0))),
    }
