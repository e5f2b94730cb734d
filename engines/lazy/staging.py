"""engine=lazy's staging: a part file's host buffer (the whole part, or a ring of write requests the copy reuses once
they are written; docs/engines.md#staging), its save in flight, which hands each request to the writers once the copy
has passed it, and the writer pool: O_DIRECT where the file system takes it, buffered where it refuses (said in the
save's direct_io_fallback); the last request of a part fsyncs it."""

from __future__ import annotations

import errno
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from engines.lazy.buffers import aligned, aligned_empty, byte_view, padded_view
from engines.lazy.policy import SaveStats
from restart_harness import faults


class Part:
    """One part file this rank writes: its buffer (the whole part, or a ring of `slots` write requests: request c in
    slot c % slots; docs/engines.md#staging), and which tensors go where in it."""

    def __init__(self, path: Path, size: int, pinned: bool, copies: list[tuple[int, int, int]], chunk: int,
                 slots: int | None = None):
        self.path, self.size, self.chunk = path, size, chunk
        self.copies = copies  # (tensor index, offset, nbytes), by offset
        self.chunks = max(1, -(-aligned(size) // chunk))  # write requests of the part
        self.slots = min(slots or self.chunks, self.chunks)
        self.ring = self.slots < self.chunks
        self.nbytes = self.slots * chunk if self.ring else size  # the buffer's bytes (its padding aside)
        self.buffer = aligned_empty(self.nbytes, pinned=pinned, zeroed=True, huge_pages=True)
        self.holds: list = [None] * self.slots  # the request each slot holds the bytes of (None: zeros)
        self.gaps = gaps(copies, aligned(size), chunk) if self.ring else {}
        self.busy = False

    def at(self, pos: int) -> int:
        """Where the part's byte `pos` is staged in the buffer (a ring: in the slot of its request)."""
        return pos // self.chunk % self.slots * self.chunk + pos % self.chunk if self.ring else pos

    def staged(self, pos: int, n: int):
        """The buffer's n bytes staging the part's bytes from `pos` (within one request when it is a ring)."""
        return self.buffer[self.at(pos):self.at(pos) + n]


def gaps(copies: list[tuple[int, int, int]], length: int, chunk: int) -> dict[int, list[tuple[int, int]]]:
    """Per write request, the byte ranges of the part that no tensor covers (alignment gaps, the end's padding)."""
    out: dict[int, list[tuple[int, int]]] = {}
    pos = 0
    for a, b in [*((off, off + n) for _, off, n in copies), (length, length)]:
        while pos < a:  # a gap from pos to a, cut at request boundaries
            end = min(a, (pos // chunk + 1) * chunk)
            out.setdefault(pos // chunk, []).append((pos, end))
            pos = end
        pos = max(pos, b)
    return out


class Flush:
    """One part's save in flight: each write request handed to the writers once the copy has passed its end
    (ready()); the last to finish fsyncs the file and completes `done` (docs/engines.md#enginelazy)."""

    def __init__(self, part: Part, step: int | None, direct: bool, chunk: int, writers: Writers):
        self.part, self.step, self.direct = part, step, direct
        self.view = padded_view(part.buffer) if direct else byte_view(part.buffer)
        self.length = aligned(part.size) if direct else part.size
        self.offsets = list(range(0, self.length, chunk)) or [0]
        self.chunk, self.writers = chunk, writers
        self.handed = 0  # requests handed to the writers so far, in offset order
        self.lock = threading.Lock()
        self.left = len(self.offsets)
        self.fds: list[int] = []  # every descriptor opened (closed at the end, never while a request may use one)
        # the first error; the open descriptor; why O_DIRECT was refused; when the first write began
        self.error = self.fd = self.fallback = self.started = None
        self.done: Future = Future()
        # a ring: the requests the copy has taken slots for, and per slot the last request written from it
        self.claimed = -1 if part.ring else len(self.offsets) - 1
        self.written = [-1] * part.slots
        self.freed = threading.Condition()
        self.waited = 0.0  # seconds the copy waited for a slot

    def data(self, off: int, end: int) -> memoryview:
        """The staged bytes of the request [off, end)."""
        return self.view[self.part.at(off):self.part.at(off) + end - off]

    def claim_upto(self, c: int) -> bool:
        """A ring: take the slots of every request up to c (the last request at most), each once the request staged
        there before is written, zeroing its gaps where the slot held another request. False: a write failed, the
        copy stops (wait() raises it, not the training step)."""
        part = self.part
        c = min(c, len(self.offsets) - 1)
        while self.claimed < c:
            k = self.claimed + 1
            slot = k % part.slots
            if k >= part.slots:
                before = k - part.slots  # the request staged in this slot before k
                with self.freed:
                    if self.written[slot] < before:
                        start = time.perf_counter()
                        self.freed.wait_for(lambda slot=slot, before=before: self.written[slot] >= before
                                            or self.error is not None)
                        self.waited += time.perf_counter() - start
            if self.error is not None:
                return False
            if part.holds[slot] not in (None, k):
                for a, b in part.gaps.get(k, ()):
                    part.staged(a, b - a).zero_()
            part.holds[slot] = k
            self.claimed = k
        return self.error is None

    def release(self, off: int) -> None:
        """Request at `off` written (or given up): its slot may take the next request."""
        if self.part.ring:
            c = off // self.chunk
            with self.freed:
                self.written[c % self.part.slots] = c
                self.freed.notify_all()

    def ready(self, upto: int | None = None) -> None:
        """Every byte before `upto` (None: all of them) is final: hand out the requests that end there or before
        (in a ring, of those the copy has taken slots for)."""
        upto = self.length if upto is None else upto
        last = min(len(self.offsets), self.claimed + 1)
        while self.handed < last and min(self.offsets[self.handed] + self.chunk, self.length) <= upto:
            self.writers.pool.submit(self.writers.write_request, self, self.offsets[self.handed])
            self.handed += 1

    def failed(self, error: BaseException) -> None:
        """The copy failed: every request left is handed out to count down, none writes, `done` gets the error."""
        with self.lock:
            self.error = self.error or error
        self.claimed = len(self.offsets) - 1  # the requests left only count down, none is written
        self.ready()


class Writers:
    def __init__(self, threads: int, stats: SaveStats):
        self.pool, self.stats = ThreadPoolExecutor(threads, thread_name_prefix="lazy-write"), stats

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
                pos, data = off, flush.data(off, end)
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
