"""A sampler's trace (py-spy's Chrome trace-event output, profiles/<record>/samples.json) as stretches of one
unchanged stack per thread, on the sampler's clock.

py-spy writes a frame's begin (ph B) and end (ph E) event only where a thread's stack changed between two samples,
each stamped with the microseconds since it started; a thread's stack from one sample to its next is the first's.
Time with no frame is time the sampler saw nothing of the thread (before it found the process, after it ended)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from third_party import py_spy_chrometrace


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int


@dataclass
class Thread:
    pid: int
    tid: int
    spans: list[tuple[float, float, tuple[int, ...]]] = field(default_factory=list)  # (start s, end s, frame ids)

    @property
    def first(self) -> float | None:
        return self.spans[0][0] if self.spans else None


@dataclass
class Trace:
    frames: list[Frame]
    threads: dict[tuple[int, int], Thread]

    def of_pid(self, pid: int, tid: int | None = None) -> Thread | None:
        """A process's thread: `tid` (pthread_t) where known, else the one seen first (a process's first thread is
        its main thread)."""
        if tid is not None and (pid, tid) in self.threads:
            return self.threads[(pid, tid)]
        mine = [t for t in self.threads.values() if t.pid == pid and t.spans]
        return min(mine, key=lambda t: t.first) if mine else None


def read(path: Path) -> Trace:
    """The trace, its samples replayed per thread id as py-spy wrote them (third_party/py_spy_chrometrace.py: forked
    processes share thread ids, which py-spy 0.4.3's writer does not tell apart)."""
    frames: list[Frame] = []
    index: dict[tuple[str, str, int], int] = {}

    def intern(e: dict) -> int:
        args = e.get("args") or {}
        frame = (e["name"], args.get("filename") or "", int(args.get("line") or 0))
        if frame not in index:
            index[frame] = len(frames)
            frames.append(Frame(*frame))
        return index[frame]

    threads: dict[tuple[int, int], Thread] = {}
    last: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}
    for pid, tid, ts, stack in py_spy_chrometrace.samples(json.loads(path.read_text()), intern):
        key = (pid, tid)
        thread = threads.setdefault(key, Thread(pid, tid))
        if key in last:
            start, previous = last[key]
            if previous and ts > start:
                thread.spans.append((start, ts, previous))
        last[key] = (ts, stack)
    return Trace(frames, threads)
