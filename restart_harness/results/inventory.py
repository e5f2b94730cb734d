"""Inventory of one checkpoint tag: every file (or object), its bytes, its kind and its writing rank."""

from __future__ import annotations

from collections import defaultdict

from restart_harness.schema import KINDS, classify


def build(where: str, writers: dict[str, int] | None, entries: list[tuple[str, int]]) -> dict:
    """The inventory of one tag stored at `where` (a folder or a URL): entries are (path relative to the tag, bytes)
    of every stored file or object; writers maps a DeepSpeed path to the rank whose engine save wrote it."""
    writers = writers or {}
    files = [{"path": rel, "bytes": nbytes, "kind": classify(rel),
              "rank": writers.get(rel, writers.get(rel.split("/")[0]))} for rel, nbytes in sorted(entries)]
    by_kind = {k: {"files": 0, "bytes": 0} for k in KINDS}
    by_rank: dict = defaultdict(lambda: {"files": 0, "bytes": 0})
    for f in files:
        for tally in (by_kind[f["kind"]], by_rank["unknown" if f["rank"] is None else str(f["rank"])]):
            tally["files"] += 1
            tally["bytes"] += f["bytes"]
    return {
        "dir": where, "files": files, "total_files": len(files),
        # DeepSpeed files: one per engine.save() path, whether a file or a directory of shards (torchsnapshot, dcp)
        "total_entries": len({f["path"].split("/", 1)[0] for f in files}),
        "total_bytes": sum(f["bytes"] for f in files),
        "by_kind": by_kind,
        "by_rank": dict(sorted(by_rank.items(), key=lambda kv: (kv[0] == "unknown", int(kv[0]) if kv[0].isdigit() else 0))),
    }
