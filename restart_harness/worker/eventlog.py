"""Per-rank event log: one JSON object per line, appended and flushed as it happens. The records are the typed events
of restart_harness/schema.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from restart_harness.schema import Event, Mark


class EventLog:
    def __init__(self, path: Path, rank: int, probes=(), anchors=None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        # () -> {field: value}: what a phase did since the previous call (worker/memory.py's high-water marks,
        # worker/io_marks.py's I/O), merged into the mark that ends it
        self.probes = tuple(probes)
        # mark -> Anchor | None: a sampled rank's pause after a live mark (worker/anchor.py, attribution=)
        self.anchors = anchors
        # Kept open for the life of the rank, line-buffered: the launcher follows progress live.
        self._file = open(path, "a", buffering=1)  # noqa: SIM115

    def emit(self, event: Event, t: float | None = None) -> None:
        record = {"t": time.time() if t is None else t, "rank": self.rank, "event": event.kind, **event.fields()}
        self._file.write(json.dumps(record, sort_keys=False) + "\n")

    def phase_fields(self) -> dict:
        """The probes' figures for the phase since the previous call (or mark)."""
        out: dict = {}
        for probe in self.probes:
            out.update(probe())
        return out

    def mark(self, name: str, t: float | None = None, fields: dict | None = None) -> None:
        """A milestone (process_start, imports_done, dist_init_done, ...), with the memory high-water marks and the
        I/O of the phase it ends (since the previous mark; `fields`: phase_fields() read earlier, for a mark
        recorded after the fact). process_start carries none: the first phase's figures start at exec."""
        if fields is None:
            fields = self.phase_fields() if name != "process_start" else {}
        self.emit(Mark(name, extra=fields), t=t)
        if t is None and self.anchors is not None and (anchor := self.anchors(name)) is not None:
            self.emit(anchor)

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
