"""engine=lazy's staging: a part file's host buffer (the whole part, or a ring of write requests the copy reuses once
they are written; docs/engines.md#staging) and its save in flight, which hands each request to the writers once the
copy has passed it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

from engines.lazy.buffers import aligned, aligned_empty, byte_view, padded_view


class Part:
    """One part file this rank writes: its buffer (aligned, zeroed once), and which tensors go where in it. The
    buffer holds the whole part, or a ring of `slots` write requests: request c in slot c % slots, taken once the
    request before it there is written (Flush.claim_upto), its gaps zeroed where the slot held another request."""

    def __init__(self, path: Path, size: int, pinned: bool, copies: list[tuple[int, int, int]], chunk: int,
                 slots: int | None = None):
        self.path, self.size, self.chunk = path, size, chunk
        self.copies = copies  # (tensor index, offset, nbytes), by offset
        self.chunks = max(1, -(-aligned(size) // chunk))  # write requests of the part
        self.slots = min(slots or self.chunks, self.chunks)
        self.ring = self.slots < self.chunks
        self.nbytes = self.slots * chunk if self.ring else size  # the buffer's bytes (its padding aside)
        self.buffer = aligned_empty(self.nbytes, pinned=pinned, zeroed=True)
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
    """One part's save in flight: the copy fills its buffer in offset order, and the copy thread hands each write
    request to the writers the moment the copy has passed the request's end (ready()): no thread waits on another,
    so the training step beside it is interrupted only by requests that have work. The last request to finish
    truncates the padding away, fsyncs and closes the file and completes `done`. A ring buffer (Part) is the one
    exception: the copy waits to take a slot until the request staged there before is written (claim_upto)."""

    def __init__(self, part: Part, step: int | None, direct: bool, chunk: int, submit):
        self.part, self.step, self.direct = part, step, direct
        self.view = padded_view(part.buffer) if direct else byte_view(part.buffer)
        self.length = aligned(part.size) if direct else part.size
        self.offsets = list(range(0, self.length, chunk)) or [0]
        self.chunk, self.submit = chunk, submit
        self.handed = 0  # requests handed to the writers so far, in offset order
        self.lock = threading.Lock()
        self.left = len(self.offsets)
        self.fds: list[int] = []  # every descriptor opened (closed at the end, never while a request may use one)
        # the first error; the open descriptor; why O_DIRECT was refused; when the first write began
        self.error: BaseException | None = None
        self.fd = self.fallback = self.started = None
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
            self.submit(self, self.offsets[self.handed])
            self.handed += 1

    def failed(self, error: BaseException) -> None:
        """The copy failed: every request left is handed out to count down, none writes, `done` gets the error."""
        with self.lock:
            self.error = self.error or error
        self.claimed = len(self.offsets) - 1  # the requests left only count down, none is written
        self.ready()

