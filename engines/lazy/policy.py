"""engine=lazy's policies: how each part of a save is staged, which way the part files are read at restart, and
which way a replicated file reaches every replica, each answering with its reason (docs/engines.md#enginelazy); and
its statistics and decision records, typed, each rendering the dict a result file holds (engine_statistics of a save
or of a restart's load: docs/results.md)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engines.lazy import MIB, Options

# parts whose staging (bytes, buffer, why) every save's engine_statistics lists; all of them are in staging_bytes
STAGING_RECORDS = 16
SECONDS = ("copy_seconds", "step_wait_seconds", "write_seconds", "staging_wait_seconds")  # since the last call


@dataclass
class Decision:
    """A choice and why it was made (the read way, a replicated file's way); figures: what it was computed from."""

    way: str
    why: str
    figures: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"way": self.way, "why": self.why, **self.figures}


@dataclass
class SaveStats:
    """A rank's saves since statistics() was last asked (seconds; the fallback), and its buffers (counted over the
    run, as kept for later saves)."""

    copy_seconds: float = 0.0  # copying, its waits for a ring's slots apart
    step_wait_seconds: float = 0.0  # the optimizer steps' waits for copies not yet done
    write_seconds: float = 0.0  # from a part's first write request to its fsync, summed over parts
    staging_wait_seconds: float = 0.0  # the copy's waits for a ring's slots
    buffers_reused: int = 0
    buffers_allocated: int = 0
    staging: list[dict] = field(default_factory=list)  # how a part's buffer was sized (policy.Staging), the first
    direct_io_fallback: str | None = None  # why the file system refused O_DIRECT
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + seconds)

    def take(self, parts: list) -> dict:
        """The record of the saves since the last call (then reset), with staging_bytes: the parts kept for later
        saves, their bytes and their buffers' (docs/engines.md#staging)."""
        with self.lock:
            out = {**{k: round(getattr(self, k), 6) for k in SECONDS}, "buffers_reused": self.buffers_reused,
                   "buffers_allocated": self.buffers_allocated}
            if self.staging:
                out["staging"] = list(self.staging)
            if self.direct_io_fallback:
                out["direct_io_fallback"] = self.direct_io_fallback
            for k in SECONDS:
                setattr(self, k, 0.0)
            self.direct_io_fallback = None
        if parts:
            out["staging_bytes"] = {"parts": len(parts), "part_bytes": sum(p.size for p in parts),
                                    "buffer_bytes": sum(p.nbytes for p in parts)}
        return out


@dataclass
class LoadStats:
    """What a rank's restart loads did (summed over ranks in the summary)."""

    read_bytes: int = 0  # read from storage by this rank
    broadcast_bytes: int = 0  # received from another replica
    broadcast_loads: int = 0
    prefetched_bytes: int = 0  # the rank's own ZeRO file read ahead
    read_io: Decision | None = None  # the restart's read way (policy.read_way)
    pages: Decision | None = None  # the load buffers' pages (policy.load_pages)
    shared_bytes: int | None = None  # built on another replica's reads into shared memory
    replicated: list[dict] = field(default_factory=list)  # how each replicated file was loaded

    def as_dict(self, reads: list) -> dict:
        """read_requests and populated_requests: the requests read, and those whose fresh pages a thread faulted in
        ahead of them (buffers.Reads)."""
        out = {k: v for k, v in vars(self).items() if v is not None and v != []}  # in the order declared
        return {**out, "read_io": self.read_io.as_dict(), **({"pages": self.pages.as_dict()} if self.pages else {}),
                "read_requests": sum(r.requests for r in reads),
                "populated_requests": sum(r.populated for r in reads)}


def load_pages(direct: bool, reporting_order: int | None) -> Decision:
    """The pages of a load's buffers: transparent huge pages where the reads are O_DIRECT, so each request's memory is
    physically contiguous and reaches the device whole (a scatter list of 4 KiB pages cut it to about 1 MiB here);
    4 KiB pages where reads go through the page cache, or where the kernel hands free blocks of a huge page's size
    back to its hypervisor (kernel_memory.free_page_reporting_order), since every fresh huge page then costs the
    host's fault (docs/engines.md#enginelazy)."""
    if not direct:
        return Decision("4k", "4 KiB pages: reads through the page cache, whose requests these pages do not shape")
    if reporting_order is not None:
        return Decision("4k", f"4 KiB pages: this kernel hands free blocks of {4 << reporting_order:,} KiB and up back "
                              "to its hypervisor (virtio-balloon free page reporting), so a fresh huge page costs the "
                              "host's fault", {"free_page_reporting_order": reporting_order})
    return Decision("huge", "transparent huge pages: an O_DIRECT request's memory physically contiguous")


def replicated_way(file_bytes: int, replicas: int, broadcast_mib_s: float | None,
                   read_mib_s_per_reader: float | None) -> Decision:
    """Broadcast the other replicas' shares of a replicated file, F / B seconds, or have every replica read them,
    F (d-1)/d / r, whichever is sooner; without r or B the broadcast (docs/engines.md#enginelazy)."""
    if not read_mib_s_per_reader or not broadcast_mib_s:
        return Decision("broadcast", "no storage read bandwidth (no probe: baseline=false, or it failed, and the "
                                     "shares too small to time): the broadcast, which reads the fewest bytes")
    f, d = file_bytes / MIB, replicas
    r, b = read_mib_s_per_reader, broadcast_mib_s
    read_s, broadcast_s = f * (d - 1) / d / r, f / b
    way = "broadcast" if broadcast_s < read_s else "read"
    why = (f"{'broadcast' if way == 'broadcast' else 'every replica reads'}: {min(read_s, broadcast_s):.3f} s "
           f"against {max(read_s, broadcast_s):.3f} s for the other replicas' shares (broadcast {b:,.0f} MiB/s over "
           f"the data-parallel group, storage {r:,.0f} MiB/s a reader, {f:,.1f} MiB over {d} replicas)")
    return Decision(way, why, {"predicted_broadcast_seconds": round(broadcast_s, 6),
                               "predicted_read_seconds": round(read_s, 6), "broadcast_mib_s": round(b, 1),
                               "read_mib_s_per_reader": round(r, 1)})


HOLD_REQUESTS = 4  # requests a reader thread of the probe must move before its pace is a stream's


def read_way(options: Options, storage: dict | None) -> Decision:
    """How the part files are read at restart: read_io's way, or auto's (docs/engines.md#enginelazy)."""
    if options.read_io != "auto":
        return Decision(options.read_io, f"read_io={options.read_io}")
    ceiling = (storage or {}).get("ceiling") if storage and not storage.get("error") else None
    source = (ceiling or {}).get("read_from")
    way = "direct" if options.direct_io else "buffered"
    if source not in ("fio", "direct", "buffered", "baseline"):
        return Decision(way, f"no storage probe with a ceiling to go by: direct_io={str(options.direct_io).lower()}")
    probe = ceiling.get("direct") or {}
    each = (storage.get("file_bytes") or 0) / max(1, probe.get("request_bytes") or 1) / (probe.get("queue_depth") or 1)
    if storage.get("file_bytes") and each < HOLD_REQUESTS:
        # a probe of a request or two a thread times one request's latency, not a stream (issue 67: 310 and 266
        # MiB/s at `small dp=2` where the engine read 1,322): no measurement to choose by
        return Decision(way, f"the storage probe's reads ({each:.1f} requests a reader thread, under {HOLD_REQUESTS}) "
                             f"do not show a stream's pace: direct_io={str(options.direct_io).lower()}")
    direct, buffered = probe.get("read_mib_s"), probe.get("buffered_read_mib_s")
    if direct and buffered and not probe.get("refused"):
        shape = "faster in the probe's cold reads in this engine's shape"
        if direct >= buffered:
            return Decision("direct", f"{shape}, O_DIRECT {direct:,.0f} MiB/s against buffered {buffered:,.0f}")
        return Decision("buffered", f"{shape}, buffered {buffered:,.0f} MiB/s against O_DIRECT {direct:,.0f}")
    if source == "direct":
        return Decision("direct", "the storage's read ceiling came from the O_DIRECT probe")
    return Decision("buffered", f"the storage's read ceiling came from its {source} read")


def per_rank(storage: dict | None, figure: str) -> float | None:
    """The probe's ceiling (else its baseline) figure over its concurrent ranks (MiB/s a rank: write_mib_s, or
    read_mib_s a reader); None without a probe."""
    if not storage or storage.get("error"):
        return None
    total = (storage.get("ceiling") or {}).get(figure) or storage.get(figure)
    return total / (storage.get("ranks") or 1) if total else None


class Staging:
    """staging_mib's choice for each new part's buffer (docs/engines.md#staging)."""

    def __init__(self, options: Options, storage: dict | None):
        self.options = options
        self.write_mib_s = per_rank(storage, "write_mib_s")
        self.step_marks: list[float] = []  # perf_counter at the last optimizer steps before the first save
        self.lag: dict = {}  # auto: the save's tag directory, and the bytes its writes may still lag by

    def mark_step(self) -> None:
        self.step_marks = [*self.step_marks[-3:], time.perf_counter()]

    def choose(self, d: Path, length: int, chunk: int, pinned: bool) -> tuple[int | None, str]:
        """How many write requests' worth a new part's buffer stages (None: the whole part), and why
        (docs/engines.md#staging)."""
        chunks = -(-length // chunk)
        least = self.options.writers + 1  # a slot for every request in flight and one being copied
        if self.options.staging_mib:
            slots = max(self.options.staging_mib * MIB // chunk, least)
            if slots >= chunks:
                return None, f"staging_mib={self.options.staging_mib}: the whole part fits"
            return slots, (f"staging_mib={self.options.staging_mib}: a ring of {slots} requests"
                           + (f", the least: a request for each of the {self.options.writers} writers and one "
                              f"being copied"
                              if slots * chunk > self.options.staging_mib * MIB else ""))
        if chunks <= least:
            return None, (f"auto: the whole part: its {chunks} request{'s are' if chunks != 1 else ' is'} no more than a "
                          f"ring's least, writers + 1 = {least}")
        if pinned:
            return None, ("auto on CUDA: the whole part (its copies are queued on the side stream at save() and the "
                          "step waits for them on the GPU; a ring's must wait on the host)")
        w = self.write_mib_s
        intervals = [b - a for a, b in zip(self.step_marks, self.step_marks[1:], strict=False)]
        if not w or not intervals:
            return None, ("auto: the whole part (" + ("no storage probe with a write figure" if not w else
                                                      "fewer than two optimizer steps before the save") + ")")
        tag = str(d.parent)
        if self.lag.get("tag") != tag:
            self.lag = {"tag": tag, "left": int(w * MIB * min(intervals) / 2)}
        reuse = min(self.lag["left"] // chunk, chunks - least)
        if reuse <= 0:
            return None, (f"auto: the whole part: the writes may lag the copy by only {self.lag['left'] / MIB:,.1f} MiB "
                          f"more in this checkpoint, less than a request")
        self.lag["left"] -= reuse * chunk
        return chunks - reuse, (f"auto: a ring of {chunks - reuse} of the part's {chunks} requests: the writers "
                                f"({w:,.0f} MiB/s a rank, the storage probe's write ceiling) are expected to write "
                                f"what the ring reuses within half the {min(intervals):.3f} s between optimizer steps")
