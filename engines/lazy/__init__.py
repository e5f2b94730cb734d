"""engine=lazy: the harness's own engine, built to show how close to the storage a checkpoint can get. This module is
what the harness asks of it (no torch); each idea of a rank's CheckpointIO is a module beside it, mapped in
docs/engines.md#enginelazy."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engines.base import CheckpointIO, Engine, EngineContext, EngineRecords, FileLayout
from restart_harness.files.baseline import CEILING_QUEUE_DEPTH, CEILING_REQUEST_BYTES
from restart_harness.schema import MIB
from restart_harness.spec.keys import key

# the files DeepSpeed has data-parallel replica 0 write (not ZeRO-3's zero_pp_rank_N_mp_rank_NN_model_states.pt: a
# data-parallel rank's own)
REPLICATED = re.compile(r"(?:^|/)mp_rank_\d+_model_states\.pt$")


@dataclass
class Options:
    # the defaults are the storage ceiling's shape (files/baseline.py); why: docs/engines.md#enginelazy
    writers: int = key(CEILING_QUEUE_DEPTH, "writer threads per rank: write requests in flight", group="checkpoint",
                       minimum=1, maximum=256)
    readers: int = key(CEILING_QUEUE_DEPTH, "reader threads per rank at restart: read requests in flight",
                       group="checkpoint", minimum=1, maximum=256, restart=True)
    write_chunk_mib: int = key(CEILING_REQUEST_BYTES // MIB, "bytes per write request", group="checkpoint",
                               unit="MiB", minimum=1)
    read_chunk_mib: int = key(CEILING_REQUEST_BYTES // MIB, "bytes per read request at restart", group="checkpoint",
                              unit="MiB", minimum=1, restart=True)
    staging_mib: int = key(0, "host staging buffer of each part file a rank writes: a ring of write requests that "
                              "the copy reuses once their writes are done (at least writers + 1 requests); 0 (auto): "
                              "the part less what the writers are expected to write within half the optimizer step's "
                              "interval, by the storage probe's write ceiling and the interval measured before the "
                              "first save (the whole part on CUDA, without a probe or without two steps before it)",
                           group="checkpoint", unit="MiB", minimum=0)
    balance: bool = key(True, "replicated model files written by all data-parallel replicas in balanced shares "
                              "(false: by replica 0, as DeepSpeed does)", group="checkpoint")
    balance_min_mib: int = key(4, "split a replicated file only when each share gets at least this much",
                               group="checkpoint", unit="MiB", minimum=0)
    direct_io: bool = key(True, "write the part files with O_DIRECT (aligned buffers and requests, no page cache; "
                                "false: buffered), and read them so where read_io=auto has no storage probe to go by; "
                                "where the file system refuses it, buffered I/O, recorded as direct_io_fallback in the "
                                "save's engine_statistics", group="checkpoint")
    read_io: str = key("auto", "at restart, read the part files with O_DIRECT (direct), through the page cache "
                               "(buffered), or the way the run's storage probe read faster in this engine's shape "
                               "(auto: its O_DIRECT and its buffered read; without a probe, or with one of under 4 requests a "
                               "reader thread, direct_io's way)",
                       group="checkpoint", choices=("auto", "direct", "buffered"), restart=True)
    broadcast_load: str = key("auto", "at restart, a replicated model file is read once per data-parallel group (each "
                                      "part by one replica) and broadcast to the other replicas (true), read by "
                                      "every replica (false), or whichever is sooner by the broadcast's bandwidth "
                                      "measured over the group and the storage's read bandwidth per reader from its "
                                      "probe (auto; replicas on one node reading buffered share its page cache: "
                                      "every replica reads)", group="checkpoint", choices=("auto", "true", "false"),
                              restart=True)


class LazyFiles(FileLayout):
    """DeepSpeed's files; with broadcast_load a replicated model file is read once per data-parallel group."""

    def restart_read_bytes(self, path: str, nbytes: int, dp_rank: int) -> int:
        """With broadcast_load (auto planned as the broadcast), a replicated model file is read once per group."""
        dp, o = self.spec.dp, self.options
        if not (o.broadcast_load != "false" and dp > 1 and REPLICATED.search(path)):
            return nbytes
        if o.balance and nbytes >= dp * o.balance_min_mib * 2**20:
            return nbytes // dp + (nbytes % dp if dp_rank == 0 else 0)
        return nbytes if dp_rank == 0 else 0


class LazyRecords(EngineRecords):
    @staticmethod
    def staging(record: dict[int, list[dict]]) -> dict | None:
        """How the last save was staged in host buffers on the rank with the most buffer bytes
        (docs/engines.md#staging)."""
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
            pages = f"; into {stats['pages']['why']}" if stats.get("pages") else ""
            rows.append(("reads", f"{'O_DIRECT' if way['way'] == 'direct' else 'buffered'}: {way['why']}{pages}"
                                  + (f"; fresh pages faulted in ahead of {stats.get('populated_requests', 0):,} of "
                                     f"{requests:,} requests (all ranks)" if requests else "")))
        return rows + [("replicated", f"{r['file']}: {r['way']} in {r['seconds']:.3f} s ({r['why']})")
                       for r in stats.get("replicated") or []]


class LazyEngine(Engine):
    name = "lazy"
    description = ("the harness's own: lazy copy overlapping the next step, aligned writes following the copy at the "
                   "storage ceiling's queue depth from buffers no larger than the writes need, balanced replica "
                   "writes, parallel reads and read-ahead into preallocated buffers, a replicated file broadcast or "
                   "read by every replica as measured (engines/lazy/)")
    Options = Options
    emulates = False  # needs the DeepSpeed engine to hook its optimizer step
    file_layout = LazyFiles
    records = LazyRecords
    durable_on_wait = True  # its writers fsync each part file before wait() returns
    fault_point = "flush"  # its files are written by its own flush, not through the recorder

    def asynchronous(self) -> bool:
        return True

    def ds_config(self) -> dict:
        return {"checkpoint": {"parallel_write": {"pipeline_stage": True}}} if self.spec.pp > 1 else {}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        from engines.lazy.save import LazyIO

        return LazyIO(self.options, ctx.training, storage=ctx.storage)
