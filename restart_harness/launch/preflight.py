"""Before a restart-only launch: is the committed checkpoint whole? Checked against what the save recorded.

`latest` must exist, name a tag directory that exists, and every file each rank's save event recorded for that
tag (path and bytes, events/checkpoint/rank-*.jsonl) must be there with the recorded size. Anything else is a
torn or missing checkpoint: one line naming the file, exit code 2, before anything is launched or written."""

from __future__ import annotations

from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.results import events as ev


def _size(path: Path) -> int | None:
    """Bytes of a file, or of every file below a directory (sharded engines); None when absent."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return None


def recorded_files(run_dir: Path, tag: str) -> dict[str, int]:
    """path (relative to the tag directory) -> bytes, from every rank's save event for tag."""
    out: dict[str, int] = {}
    for saves in ev.of_kind(ev.read_record(run_dir, "checkpoint"), "save").values():
        for save in saves:
            if save["tag"] == tag:
                out.update({f["path"]: f["bytes"] for f in save["files"]})
    return out


def committed_checkpoint(run_dir: Path, ckpt_root: Path) -> str:
    """The tag `latest` names, after checking every recorded file of it; raises UsageError naming the problem."""
    if not ckpt_root.is_dir():
        raise UsageError(f"run {run_dir.name}: checkpoint directory {ckpt_root} is missing; nothing to restart from")
    latest = ckpt_root / "latest"
    if not latest.is_file():
        raise UsageError(f"{latest}: missing, no checkpoint was committed; nothing to restart from")
    tag = latest.read_text().strip()
    tag_dir = ckpt_root / tag
    if not tag or not tag_dir.is_dir():
        raise UsageError(f"{tag_dir}: missing, but {latest} names it")
    recorded = recorded_files(run_dir, tag)
    if not recorded:
        raise UsageError(f"{tag_dir}: no save of {tag} is recorded in {run_dir / 'events' / 'checkpoint'}, "
                         "so it cannot be checked as complete")
    for rel, nbytes in sorted(recorded.items()):
        actual = _size(tag_dir / rel)
        if actual is None:
            raise UsageError(f"{tag_dir / rel}: missing (the save of {tag} recorded {nbytes} bytes)")
        if actual != nbytes:
            raise UsageError(f"{tag_dir / rel}: {actual} bytes, but the save of {tag} recorded {nbytes} "
                             "(truncated or torn)")
    return tag
