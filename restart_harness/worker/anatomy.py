"""Where a load's (or a save's) wall time goes on one rank: every second attributed to exactly one category by what the
main thread was doing, "in flight" from the preloaded I/O counters (restart_harness/iocount). docs/anatomy.md."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

from restart_harness import iocount

MAX_INTERVALS = 2000  # for the timeline figure; a window with more regions keeps the first ones
# DeepSpeed's comm functions that block until the other ranks take part.
COLLECTIVES = ("barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "all_reduce", "all_gather",
               "all_gather_into_tensor", "allgather_fn", "reduce", "reduce_scatter_tensor", "reduce_scatter_fn",
               "all_to_all_single", "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "gather_object", "scatter_object_list")


class Window:
    """One timed window (a restart's load, or one save) with exclusive attribution of its seconds."""

    def __init__(self, counters: iocount.Counters, categories: tuple[str, ...], sync=None,
                 excluded: tuple[str, ...] = (), start: tuple[float, float] | None = None):
        # excluded: regions not part of what is measured (an emulated save's data generation), out of the window
        self.counters, self.categories, self.excluded = counters, categories, excluded
        self.sync = sync or (lambda: None)  # CUDA: torch.cuda.synchronize
        self.seconds: dict[str, float] = defaultdict(float)
        self.stream_bytes: dict[str, int] = defaultdict(int)  # bytes through a target's network streams
        self.intervals: list[tuple[str, float, float]] = []
        self._stack: list[list] = []
        self.start_wall, self.start = start or (time.time(), time.perf_counter())
        self.end_wall: float | None = None
        self.io_start = counters.totals()
        self.files_start = counters.files()
        self.end: float | None = None

    def _busy(self) -> dict[str, float]:
        t = self.counters.totals()
        return {c: t[c]["busy_seconds"] for c in iocount.CLASSES} if t else {}

    @contextlib.contextmanager
    def region(self, category: str, io: tuple[str, ...] = ()):
        """Time a region; `io` classes in flight during its own time are attributed to those categories instead
        (read for a load; write and sync->fsync for a save)."""
        self.sync()  # device work queued before the region belongs to what came before
        frame = [category, time.perf_counter(), 0.0, self._busy() if io else {}]
        self._stack.append(frame)
        try:
            yield
        finally:
            self.sync()
            end = time.perf_counter()
            self._stack.pop()
            elapsed = end - frame[1]
            own = elapsed - frame[2]
            if io and frame[3]:
                busy = self._busy()
                for cls in io:
                    share = min(max(0.0, busy[cls] - frame[3][cls]), own)
                    self.seconds["fsync" if cls == "sync" else cls] += share
                    own -= share
            self.seconds[category] += own
            if self._stack:
                self._stack[-1][2] += elapsed
            if len(self.intervals) < MAX_INTERVALS:
                self.intervals.append((category, frame[1] - self.start, end - self.start))

    def close(self, end: float | None = None) -> dict:
        """The window's record: seconds per category (other = the remainder), I/O counted in it, per-file I/O.
        end: the perf_counter() at which it ends, when the caller's clock stopped just before (default: now)."""
        self.end = time.perf_counter() if end is None else end
        self.end_wall = self.start_wall + (self.end - self.start)
        total = self.end - self.start - sum(self.seconds.get(c, 0.0) for c in self.excluded)
        attributed = sum(v for c, v in self.seconds.items() if c not in self.excluded)
        out = {c: round(self.seconds.get(c, 0.0), 6) for c in self.categories if c != "other"}
        out["other"] = round(max(0.0, total - attributed), 6)
        io_known = self.io_start is not None
        if not io_known:  # no counters: the I/O categories cannot be separated from (de)serialization
            out.update({c: None for c in ("read", "write", "fsync") if c in out})
        io = iocount.delta(self.counters.totals(), self.io_start)
        files = iocount.file_delta(self.counters.files(), self.files_start) if io_known else {}
        return {
            "start": self.start_wall,
            "end": self.end_wall,
            "window_seconds": round(total, 6),
            "seconds": out,
            "excluded_seconds": {c: round(self.seconds.get(c, 0.0), 6) for c in self.excluded},
            "io": io,
            "files": files,
            # bytes a storage target's network streams moved in its read / write regions (unseen by the I/O counters)
            "stream": dict(self.stream_bytes),
            "intervals": [(c, round(a, 6), round(b, 6)) for c, a, b in self.intervals],
            "method": "preloaded I/O counters" if io_known else "no I/O counters (no C compiler when launched)"}


class Anatomy:
    """The rank's current window, if any; the hooks below attribute time to it while one is open."""

    def __init__(self, device_type: str = "cpu", enabled: bool = True):
        self.enabled = enabled
        self.counters = iocount.Counters()
        self.window: Window | None = None
        self._sync = None
        if device_type == "cuda":
            import torch

            self._sync = torch.cuda.synchronize

    @contextlib.contextmanager
    def measure(self, categories: tuple[str, ...], excluded: tuple[str, ...] = (),
                start: tuple[float, float] | None = None):
        """Open a window for the duration of the block; yields it (close() gives its record; None when disabled)."""
        if not self.enabled:
            yield _Off()
            return
        self.window = Window(self.counters, categories, self._sync, excluded, start)
        try:
            yield self.window
        finally:
            self.window = None

    @contextlib.contextmanager
    def region(self, category: str, io: tuple[str, ...] = ()):
        # the main thread's doing only: a background flush's collectives and calls are not the window's
        if self.window is None or threading.current_thread() is not threading.main_thread():
            yield
            return
        with self.window.region(category, io):
            yield

    def add_bytes(self, category: str, nbytes: int) -> None:
        """Bytes a storage target's stream moved in a region of `category` (the main thread's, as its time)."""
        if self.window is not None and threading.current_thread() is threading.main_thread():
            self.window.stream_bytes[category] += nbytes

    def wrap(self, owner: object, name: str, category: str, io: tuple[str, ...] = ()) -> None:
        """Replace owner.name (a callable attribute) by one that runs inside region(category)."""
        if not self.enabled:
            return
        inner = getattr(owner, name)

        def wrapped(*args, **kwargs):
            with self.region(category, io):
                return inner(*args, **kwargs)

        wrapped.__wrapped__ = inner
        setattr(owner, name, wrapped)

    def hook_collectives(self, comm) -> None:
        """The collectives of the module `comm` (DeepSpeed's comm, torch.distributed), attributed to `wait` (module
        attributes: every caller looks them up)."""
        for name in COLLECTIVES:
            if callable(getattr(comm, name, None)):
                self.wrap(comm, name, "wait")


class _Off:
    """The window of a disabled anatomy (anatomy=false): records nothing."""

    def close(self, end: float | None = None) -> None:
        return None
