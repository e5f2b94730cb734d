"""engine=lazy's statistics and decision records, typed; each renders the dict a result file holds
(engine_statistics of a save or of a restart's load: docs/results.md), and LazyRecords what the summary and the
terminal make of them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engines.base import EngineRecords
from restart_harness.schema import MIB

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
    shared_bytes: int | None = None  # built on another replica's reads into shared memory
    replicated: list[dict] = field(default_factory=list)  # how each replicated file was loaded

    def as_dict(self, reads: list) -> dict:
        """read_requests and populated_requests: the requests read, and those whose fresh pages a thread faulted in
        ahead of them (reads.Reads)."""
        out = {k: v for k, v in vars(self).items() if v is not None and v != []}  # in the order declared
        return {**out, "read_io": self.read_io.as_dict(), "read_requests": sum(r.requests for r in reads),
                "populated_requests": sum(r.populated for r in reads)}


class LazyRecords(EngineRecords):
    @staticmethod
    def staging(record: dict[int, list[dict]]) -> dict | None:
        """How the saves were staged in host buffers (engine_statistics.staging_bytes and staging,
        docs/engines.md#staging), at the last save, on the rank with the most buffer bytes: its parts' bytes and
        buffers, how many of the parts listed are rings, and why its largest part was staged so."""
        best = None
        for rank, evs in sorted(record.items()):
            stats = [e["engine_statistics"] for e in evs
                     if e["event"] == "save" and (e.get("engine_statistics") or {}).get("staging_bytes")]
            if not stats:
                continue
            parts = stats[-1].get("staging") or []
            totals = stats[-1]["staging_bytes"]
            if best is None or totals["buffer_bytes"] > best["buffer_bytes"]:
                largest = max(parts, key=lambda p: p["part_bytes"], default={})
                best = {"rank": rank, **totals, "listed": len(parts),
                        "rings": sum(p["buffer_bytes"] < p["part_bytes"] for p in parts), "why": largest.get("why")}
        return best

    @staticmethod
    def memory_rows(st: dict) -> list[tuple[str, str]]:
        listed = f"{st['rings']} of {st['listed']} parts in rings" + (
            "" if st["listed"] == st["parts"] else f" (of the first {st['listed']} of {st['parts']})")
        return [("  staging", (f"{st['buffer_bytes'] / MIB:,.1f} MiB of buffers for {st['part_bytes'] / MIB:,.1f} "
                               f"MiB of parts on rank {st['rank']}, {listed}; the largest part: {st['why']}"))]

    @staticmethod
    def restart_rows(stats: dict) -> list[tuple[str, str]]:
        rows = []
        if stats.get("read_io"):
            way, requests = stats["read_io"], stats.get("read_requests")
            rows.append(("reads", f"{'O_DIRECT' if way['way'] == 'direct' else 'buffered'}: {way['why']}"
                                  + (f"; fresh pages faulted in ahead of {stats.get('populated_requests', 0):,} of "
                                     f"{requests:,} requests (all ranks)" if requests else "")))
        return rows + [("replicated", f"{r['file']}: {r['way']} in {r['seconds']:.3f} s ({r['why']})")
                       for r in stats.get("replicated") or []]
