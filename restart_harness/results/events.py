"""Read the per-rank event logs of one record (checkpoint, restart-01, ...)."""

from __future__ import annotations

import json
from pathlib import Path


def read_record(run_dir: Path, record: str) -> dict[int, list[dict]]:
    """rank -> its events in order. A torn last line (a killed rank) is skipped."""
    out: dict[int, list[dict]] = {}
    for path in sorted((run_dir / "events" / record).glob("rank-*.jsonl")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        out[int(path.stem.split("-")[1])] = events
    return out


def of_kind(events: dict[int, list[dict]], kind: str) -> dict[int, list[dict]]:
    return {rank: [e for e in evs if e["event"] == kind] for rank, evs in events.items()}


def recorded_files(events: dict[int, list[dict]], tag: str) -> dict[str, dict]:
    """path (relative to the tag) -> {bytes, and sha256 where taken} of every file the ranks' saves of tag
    recorded (a checkpoint record's events)."""
    out: dict[str, dict] = {}
    for saves in of_kind(events, "save").values():
        for save in saves:
            if save["tag"] == tag:
                out.update({f["path"]: {k: v for k, v in f.items() if k != "seconds"} for f in save["files"]})
    return out


def marks(events: list[dict]) -> dict[str, float]:
    return {e["name"]: e["t"] for e in events if e["event"] == "mark"}


def errors(events: dict[int, list[dict]]) -> list[str]:
    return [f"rank {rank}: {e['message']}" for rank, evs in sorted(events.items()) for e in evs
            if e["event"] == "error"]


def verification(events: dict[int, list[dict]], ranks: int) -> tuple[list[str], int]:
    """(what failed, tensors verified) of a restart record: every one of its `ranks` ranks must have verified its
    restored state; a rank that recorded no verification failed it."""
    failed, tensors = [], 0
    for rank in range(ranks):
        verify = next((e for e in events.get(rank, []) if e["event"] == "verify"), None)
        if verify is None:
            failed.append(f"rank {rank}: no verification recorded")
            continue
        tensors += verify["tensors"]
        if not verify["ok"]:
            failed += [f"rank {rank}: {name}" for name in verify["differing"] or ["nothing verified"]]
    return failed, tensors
