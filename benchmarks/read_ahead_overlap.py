#!/usr/bin/env python3
"""How far the storage-read figure (bytes over the seconds with a read call in flight) can overstate the storage's
pace for a reader that does other work between buffered reads, as torch.load does while it unpickles
(docs/measurements.md#two-load-figures).

Method
- One file of SIZE_MIB (default 512) of random bytes in DIR (default results/, on the disk the checkpoints use),
  written and fsync'd once, then read whole REPEATS times (default 3) in each of two ways, interleaved:
  `back to back` (one 4 MiB read() call after another) and `work between` (4 ms of sleep after each call, standing
  in for deserialization).
- Before every read the file's pages are dropped from the page cache (fsync, then posix_fadvise DONTNEED on the
  whole file, which needs no root), so every read starts cold and the kernel's read-ahead starts afresh.
- Per read: the bytes over the seconds spent inside read() calls (what the harness's storage read measures on a
  file system: the I/O counters' bytes over their read busy seconds) and the wall time. Per way: medians and
  min-max over the repeats. Back to back, the first is the storage's own pace; with work between calls, the kernel
  reads ahead while no call is in flight and the calls find the pages cached, so the same bytes over the same
  storage come out faster by about the share of the time spent between calls.
- The file is removed at the end.

Usage: <python> -m benchmarks.read_ahead_overlap [REPEATS] [dir=DIR] [size_mib=N]   (prints a Markdown table)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import MIB, REPO, spread, table, words

CALL_BYTES = 4 << 20
WORK_SECONDS = 0.004


def read_once(path: Path, work_seconds: float) -> tuple[float, float]:
    """(MiB/s over the seconds inside read() calls, wall seconds) of one cold read of the whole file."""
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # the file's pages dropped first: the read starts cold
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    inside, total, start = 0.0, 0, time.perf_counter()
    try:
        while True:
            t = time.perf_counter()
            chunk = os.read(fd, CALL_BYTES)
            inside += time.perf_counter() - t
            if not chunk:
                break
            total += len(chunk)
            if work_seconds:
                time.sleep(work_seconds)
    finally:
        os.close(fd)
    return total / MIB / inside, time.perf_counter() - start


def main() -> None:
    repeats, opts, _ = words(3, "dir", "size_mib")
    folder = Path(opts.get("dir", REPO / "results"))
    folder.mkdir(parents=True, exist_ok=True)
    size = int(opts.get("size_mib", 512)) * MIB
    fd, name = tempfile.mkstemp(prefix="rh-read-ahead-", dir=folder)
    path = Path(name)
    ways = {"back to back": 0.0, f"{WORK_SECONDS * 1000:.0f} ms of work between calls": WORK_SECONDS}
    seen: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    try:
        with os.fdopen(fd, "wb") as f:
            for _ in range(size // MIB):
                f.write(os.urandom(MIB))
            f.flush()
            os.fsync(f.fileno())
        for r in range(repeats):
            for way, work in ways.items():
                seen[way].append(read_once(path, work))
                print(f"repeat {r + 1}/{repeats}: {way}", file=sys.stderr)
    finally:
        path.unlink(missing_ok=True)
    print(f"{size // MIB} MiB file in {folder}, cold each time, {CALL_BYTES // MIB} MiB read() calls, {repeats} "
          f"repeats interleaved; medians (min-max)\n")
    table(["reads", "MiB/s over the seconds inside read()", "wall s"],
          ([way, spread([r[0] for r in rows], ",.0f"), f"{statistics.median(r[1] for r in rows):.3f}"]
           for way, rows in seen.items()))


if __name__ == "__main__":
    main()
