"""engine=lazy's writer pool: each write request of a part as soon as the copy has passed it, with O_DIRECT where the
file system takes it and buffered where it refuses (said in the save's direct_io_fallback); the last request of a
part fsyncs it."""

from __future__ import annotations

import errno
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engines.lazy.staging import Flush
from engines.lazy.stats import SaveStats
from restart_harness import faults


class Writers:
    def __init__(self, threads: int, stats: SaveStats):
        self.pool, self.stats = ThreadPoolExecutor(threads, thread_name_prefix="lazy-write"), stats

    def hand_out(self, flush: Flush, off: int) -> None:
        self.pool.submit(self.write_request, flush, off)

    def write_request(self, flush: Flush, off: int) -> None:
        """One write request of the part (handed out once the copy has passed its end); the last one to finish
        completes the part (finish)."""
        end = min(off + flush.chunk, flush.length)
        error = None
        try:
            if flush.error is None:
                with flush.lock:
                    if flush.started is None:
                        flush.started = time.perf_counter()
                fd = self.descriptor(flush)
                pos = off
                data = flush.data(off, end)
                while pos < end:
                    try:
                        pos += os.pwrite(fd, data[pos - off:], pos)
                    except OSError as exc:  # a file system that takes the O_DIRECT open and refuses the request
                        if exc.errno != errno.EINVAL:
                            raise
                        why = f"{flush.part.path.parent.parent}: {exc.strerror} (EINVAL)"
                        buffered = self.descriptor(flush, refused=why)
                        if buffered == fd:
                            raise  # refused buffered too: not O_DIRECT's doing
                        fd = buffered
                faults.hit("flush", int(os.environ.get("RANK", "0")), flush.step)  # tests: killed mid-flush
        except BaseException as exc:  # noqa: BLE001 - handed to flush.done by finish, raised by wait()
            error = exc
        with flush.lock:
            flush.left -= 1
            last = flush.left == 0
            if error is not None and flush.error is None:
                flush.error = error
        flush.release(off)
        if last:
            self.finish(flush)

    def finish(self, flush: Flush) -> None:
        part = flush.part
        try:
            if flush.error is None:
                fd = self.descriptor(flush)
                if flush.length != part.size:
                    os.ftruncate(fd, part.size)
                os.fsync(fd)
        except OSError as exc:
            flush.error = exc
        finally:
            for fd in flush.fds:
                os.close(fd)
            part.busy = False
            if flush.fallback:  # the file system refuses O_DIRECT: buffered, and said so in the save's record
                with self.stats.lock:
                    self.stats.direct_io_fallback = flush.fallback
            if flush.started is not None:
                self.stats.add("write_seconds", time.perf_counter() - flush.started)
        if flush.error is not None:
            flush.done.set_exception(flush.error)
        else:
            flush.done.set_result(None)

    def descriptor(self, flush: Flush, refused: str | None = None) -> int:
        """The part's file, opened once (O_DIRECT unless the file system refuses it: then a buffered descriptor beside
        it, for every request from then on; `refused`: why, when a request was refused)."""
        with flush.lock:
            if refused and flush.direct:
                flush.direct, flush.fd, flush.fallback = False, None, refused
            if flush.fd is None:
                flags = os.O_WRONLY | os.O_CREAT | (0 if flush.fds else os.O_TRUNC)
                if flush.direct:
                    try:
                        flush.fd = os.open(flush.part.path, flags | os.O_DIRECT, 0o644)
                    except OSError as exc:
                        if exc.errno != errno.EINVAL:
                            raise
                        flush.direct = False
                        flush.fallback = f"{flush.part.path.parent.parent}: {exc.strerror} (EINVAL)"
                if flush.fd is None:
                    flush.fd = os.open(flush.part.path, flags, 0o644)
                flush.fds.append(flush.fd)
            return flush.fd


def write_small(path: Path, data: bytes) -> None:
    """A small file (the header, the remainder) written and fsync'd (by the writers' pool too)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
