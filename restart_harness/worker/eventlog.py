"""Per-rank event log: one JSON object per line, appended and flushed as it happens. The records are the typed events
of restart_harness/schema.py. With attribution=, a sampled rank pauses right after a few marks (Anchors): the
sampler's clock and the log's are lined up from those pauses (docs/attribution.md)."""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

from restart_harness import schema
from restart_harness.schema import Anchor, Event, Mark


def _pause(until: float) -> None:
    while (left := until - time.time()) > 0:
        time.sleep(left)


def _named(mark: str):
    """_pause under the name the sampler shows (py-spy reads a code object's name, qualified from Python 3.11)."""
    name = schema.ANCHOR_PREFIX + mark
    fields = {"co_name": name, **({"co_qualname": name} if hasattr(_pause.__code__, "co_qualname") else {})}
    return types.FunctionType(_pause.__code__.replace(**fields), _pause.__globals__, name)


class Anchors:
    """The pauses after ANCHOR_MARKS, each ANCHOR_SAMPLES sampling intervals long (50 ms at 100 Hz), inside a
    function named ANCHOR_PREFIX + the mark; results/attribution.py lines the two clocks up from them."""

    def __init__(self, rate_hz: float):
        self.seconds = schema.ANCHOR_SAMPLES / rate_hz
        self.functions = {mark: _named(mark) for mark in schema.ANCHOR_MARKS}

    def __call__(self, mark: str) -> Anchor | None:
        pause = self.functions.get(mark)
        if pause is None:
            return None
        start = time.time()
        pause(start + self.seconds)
        return Anchor(mark, start, time.time())

    @classmethod
    def of_launch(cls) -> Anchors | None:
        """Anchors when this rank's launch is sampled (the launch sets the rate in its ranks' environment)."""
        rate = os.environ.get(schema.ATTRIBUTION_RATE_ENV)
        return cls(float(rate)) if rate else None


class EventLog:
    def __init__(self, path: Path, rank: int, probes=(), anchors=None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        # () -> {field: value}: what a phase did (memory high-water marks, I/O), merged into the mark that ends it
        self.probes = tuple(probes)
        self.anchors = anchors  # mark -> Anchor | None (Anchors, attribution=)
        # Kept open for the life of the rank, line-buffered: the launcher follows progress live.
        self._file = open(path, "a", buffering=1)  # noqa: SIM115
    def emit(self, event: Event, t: float | None = None) -> None:
        record = {"t": time.time() if t is None else t, "rank": self.rank, "event": event.kind, **event.fields()}
        self._file.write(json.dumps(record, sort_keys=False) + "\n")

    def phase_fields(self) -> dict:
        """The probes' figures for the phase since the previous call (or mark)."""
        return {k: v for probe in self.probes for k, v in probe().items()}

    def mark(self, name: str, t: float | None = None, fields: dict | None = None) -> None:
        """A milestone (process_start, imports_done, ...) with the probes' figures of the phase it ends (`fields`:
        phase_fields() read earlier, for a mark recorded after the fact; none for process_start)."""
        if fields is None:
            fields = self.phase_fields() if name != "process_start" else {}
        self.emit(Mark(name, extra=fields), t=t)
        if t is None and self.anchors is not None and (anchor := self.anchors(name)) is not None:
            self.emit(anchor)

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
