"""Read the per-rank event logs of one record (checkpoint, restart-01, ...)."""

from __future__ import annotations

import json
from pathlib import Path


def read_record(run_dir: Path, record: str) -> dict[int, list[dict]]:
    """rank -> its events in order. A torn last line (a killed rank) is skipped."""
    out: dict[int, list[dict]] = {}
    folder = run_dir / "events" / record
    for path in sorted(folder.glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        out[rank] = events
    return out


def of_kind(events: dict[int, list[dict]], kind: str) -> dict[int, list[dict]]:
    return {rank: [e for e in evs if e["event"] == kind] for rank, evs in events.items()}


def marks(events: list[dict]) -> dict[str, float]:
    return {e["name"]: e["t"] for e in events if e["event"] == "mark"}


def errors(events: dict[int, list[dict]]) -> list[str]:
    return [f"rank {rank}: {e['message']}" for rank, evs in sorted(events.items()) for e in evs
            if e["event"] == "error"]
