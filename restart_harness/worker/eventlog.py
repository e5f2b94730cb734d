"""Per-rank event log: one JSON object per line, appended and flushed as it happens. The records are the typed events
of restart_harness/results/schema.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from restart_harness.results.schema import Event, Mark


class EventLog:
    def __init__(self, path: Path, rank: int, peak_memory=None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        # () -> {name: bytes}: memory high-water marks since the previous call (worker/main.py); None: not recorded
        self.peak_memory = peak_memory
        # Kept open for the life of the rank, line-buffered: the launcher follows progress live.
        self._file = open(path, "a", buffering=1)  # noqa: SIM115

    def emit(self, event: Event, t: float | None = None) -> None:
        record = {"t": time.time() if t is None else t, "rank": self.rank, "event": event.kind, **event.fields()}
        self._file.write(json.dumps(record, sort_keys=False) + "\n")

    def mark(self, name: str, t: float | None = None, memory: dict | None = None) -> None:
        """A milestone (process_start, imports_done, dist_init_done, ...), with the memory high-water marks of the
        phase it ends (since the previous mark; `memory`: read earlier, for a mark recorded after the fact)."""
        if memory is None:
            memory = self.peak_memory() if self.peak_memory else {}
        self.emit(Mark(name, extra=memory), t=t)

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
