"""Event records + inventory -> summary.json (schema: restart_harness/schema.py, docs/results.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

from restart_harness import resolve
from restart_harness.results import breakdown, goodput, io_sources, placement, save_memory, trace, training_cost
from restart_harness.results import events as ev
from restart_harness.schema import (
    MEMORY_PHASES_CHECKPOINT,
    MEMORY_PHASES_EMULATED,
    MEMORY_PHASES_RESTART,
    MIB,
    PHASE_NAMES,
    RESTART_PHASES,
    SCHEMA_VERSION,
)


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]  # None: not measured
    return round(statistics.median(values), 6) if values else None


def mib_s(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / MIB / seconds, 3) if seconds > 0 else None


def saves(record: dict[int, list[dict]], committed: dict[str, dict], root: str | None = None) -> list[dict]:
    """Per save: the slowest rank's seconds; bytes and files of the whole tag directory."""
    by_tag: dict[str, list[dict]] = {}
    where, order = placement.hosts(record), placement.placement(record)
    for rank, evs in sorted(ev.of_kind(record, "save").items()):
        for e in evs:
            by_tag.setdefault(e["tag"], []).append({**e, "rank": rank})
    out = []
    for tag, per_rank in by_tag.items():
        whole = committed.get(tag, {})
        nbytes = whole.get("bytes", sum(r["bytes"] for r in per_rank))
        nodes = placement.save_per_node(per_rank, where, order) if order else None  # null: the ranks named no hosts
        blocking, durable, commit = (max(r[k] for r in per_rank) for k in ("blocking_seconds", "durable_seconds",
                                                                           "commit_seconds"))
        out.append({
            "tag": tag, "step": per_rank[0]["step"],
            "files": whole.get("files", sum(len(r["files"]) for r in per_rank)), "bytes": nbytes,
            "blocking_seconds": round(blocking, 6), "durable_seconds": round(durable, 6),
            "commit_seconds": round(commit, 6), "async": any(r.get("async", False) for r in per_rank),
            "in_flight_steps": max(r.get("in_flight_steps", 0) for r in per_rank),
            # checksums=: the slowest rank's read-back for its files' sha256, after the commit (None: not taken)
            "checksum_seconds": max((r["checksum_seconds"] for r in per_rank if r.get("checksum_seconds") is not None),
                                    default=None),
            # what made the files durable (worker/manager.py): the engine's own fsync or the harness's, and the
            # slowest rank's seconds of that fsync (None in runs of a harness before 2026-11-26)
            "durable_by": next((r["durability"]["by"] for r in per_rank if r.get("durability")), None),
            "make_durable_seconds": max((r["durability"]["make_durable_seconds"] for r in per_rank
                                         if r.get("durability")), default=None),
            "throughput_mib_s": {"blocking": mib_s(nbytes, blocking), "durable": mib_s(nbytes, durable),
                                 "commit": mib_s(nbytes, commit)},
            "per_rank": [{"rank": r["rank"], "blocking_seconds": round(r["blocking_seconds"], 6),
                          "durable_seconds": round(r["durable_seconds"], 6), "files": len(r["files"]),
                          "bytes": r["bytes"]} for r in per_rank],
            "breakdown": breakdown.save(per_rank, root), "per_node": nodes,
            "slowest_node": placement.slowest(nodes, "durable_seconds") if order else None})
    return out


def _load_figures(record, load_bytes, load_s, phases, launch) -> dict:
    """load_seconds and load_throughput_mib_s: the checkpoint's bytes over the slowest rank's seconds in the engine's
    load calls, or for a converted copy (universal checkpoint, read outside the engine) bytes read over checkpoint_load."""
    if launch.get("conversion"):
        read = sum(e["io"]["read"]["bytes"] for evs in record.values() for e in evs
                   if e["event"] == "load_anatomy" and e.get("io"))
        seconds = phases.get("checkpoint_load")
        figures = {"load_seconds": seconds, "load_bytes": read or None,
                   "load_throughput_mib_s": mib_s(read, seconds) if read and seconds else None,
                   "load_basis": "universal: bytes read by all ranks / checkpoint_load seconds"}
    else:
        figures = {"load_seconds": round(max(load_s), 6) if load_s else None, "load_bytes": load_bytes,
                   "load_throughput_mib_s": mib_s(load_bytes, max(load_s)) if load_bytes and load_s else None,
                   "load_basis": "checkpoint bytes / slowest rank's seconds in engine.load"}
    return {**figures, "layout": launch.get("layout"), "conversion": launch.get("conversion")}


LOSS_CONTINUITY_REL = 1e-3  # the order of floating-point sums changes with the layout (docs/reshard.md)


def loss_continuity(restarts: list[dict]) -> None:
    """For each restart at another layout: its first step's loss against the latest restart at the layout that
    wrote the checkpoint (same step, same global batch). A difference beyond LOSS_CONTINUITY_REL fails its
    verification; without such a restart there is nothing to compare with, and that is said."""
    for r in restarts:
        layout = r.get("layout") or {}
        if not layout or layout.get("saved") == layout.get("loaded") or r.get("first_step_loss") is None:
            continue
        same = [x for x in restarts if (x.get("layout") or {}).get("loaded", layout["saved"]) == layout["saved"]
                and x.get("first_step") == r["first_step"] and x.get("first_step_loss") is not None
                and x["record"] != r["record"]]
        if not same:
            r["loss_continuity"] = {"reference_record": None,
                                    "note": f"no restart at {layout['saved']} to compare the first loss with"}
            continue
        ref = same[-1]
        diff = abs(r["first_step_loss"] - ref["first_step_loss"])
        rel = diff / abs(ref["first_step_loss"]) if ref["first_step_loss"] else diff
        ok = rel <= LOSS_CONTINUITY_REL
        r["loss_continuity"] = {"reference_record": ref["record"], "step": r["first_step"],
                                "reference_loss": ref["first_step_loss"], "loss": r["first_step_loss"],
                                "abs_diff": diff, "rel_diff": rel, "tolerance_rel": LOSS_CONTINUITY_REL, "ok": ok}
        if not ok:
            r["verified"] = False
            r["differing"] = [*r["differing"], (f"first loss {r['first_step_loss']} vs {ref['first_step_loss']} at "
                                               f"{layout['saved']} ({ref['record']}): relative {rel:.2e}")]


def training(record: dict[int, list[dict]], emulated: bool = False) -> dict:
    steps = ev.of_kind(record, "step").get(0, [])
    busy = [s["seconds"] for s in steps if s.get("in_flight")]
    rss = [e["max_rss_bytes"] for evs in ev.of_kind(record, "done").values() for e in evs if "max_rss_bytes" in e]
    return {
        "max_rss_bytes_per_rank": max(rss) if rss else None,
        "memory": breakdown.memory(record, MEMORY_PHASES_EMULATED if emulated else MEMORY_PHASES_CHECKPOINT),
        "steps": len(steps),
        "step_seconds_median": median([s["seconds"] for s in steps]),
        "losses": [round(s["loss"], 6) for s in steps],
        "rss_growth": save_memory.training_growth(record),  # results/save_memory.py: the resident set step by step
        # rank 0's steps in order, for the step timeline (analysis: step_timeline_seconds.png)
        "step_numbers": [s["step"] for s in steps],
        "step_seconds": [round(s["seconds"], 6) for s in steps],
        "step_in_flight": [bool(s.get("in_flight")) for s in steps],
        # median step seconds with and without an async flush in flight: the overlap cost
        "steps_in_flight": len(busy),
        "step_seconds_median_in_flight": median(busy),
        "step_seconds_median_no_flush": median([s["seconds"] for s in steps if not s.get("in_flight")])}


def restart(record: dict[int, list[dict]], name: str, launch: dict, cache: dict | None,
            load_bytes: int | None, root: str | None = None, run_dir: Path | None = None) -> dict:
    """Phases as the slowest rank's seconds; the verification digest is timed apart and excluded."""
    per_rank = [_rank_restart(rank, evs) for rank, evs in sorted(record.items())]
    phases = {phase: round(max(r["phases"][phase] for r in per_rank), 6) for phase in PHASE_NAMES
              if per_rank and all(phase in r["phases"] for r in per_rank)}  # a phase every rank went through
    totals = [r["total_seconds"] for r in per_rank if r["total_seconds"] is not None]
    verifies = [r["verify"] for r in per_rank]
    verified = bool(per_rank) and all(v is not None and v["ok"] for v in verifies)
    differing = sorted({f"rank {r['rank']}: {d}" for r in per_rank if r["verify"] for d in r["verify"]["differing"]})
    starts = [r["process_start"] for r in per_rank if r["process_start"]]
    load_s = [r["load_seconds"] for r in per_rank if r["load_seconds"] is not None]
    first = next((e for e in record.get(0, []) if e["event"] == "step"), None)
    measured = {r["rank"]: r["phases"]["checkpoint_load"] for r in per_rank if "checkpoint_load" in r["phases"]}
    order = placement.placement(record)
    nodes = placement.restart_per_node(record, per_rank, order) if order else None
    return {
        "record": name, "tag": next((r["tag"] for r in per_rank if r["tag"]), None), "ranks": len(per_rank),
        "max_rss_bytes_per_rank": max((r["max_rss_bytes"] for r in per_rank if r["max_rss_bytes"]), default=None),
        "phases": phases,
        "total_seconds": round(max(totals), 6) if totals and len(totals) == len(per_rank) else None,
        "launch_seconds": round(max(starts) - launch["start"], 6) if starts and launch.get("start") else None,
        "wall_seconds": launch.get("wall_seconds"),
        "verify_seconds": round(max((v["seconds"] for v in verifies if v), default=0.0), 6),
        "verified": verified, "verified_tensors": sum(v["tensors"] for v in verifies if v),
        "differing": differing[:100],
        "launcher": launch.get("launcher"),  # what started this restart's ranks (a re-run may name another)
        "cache": cache,
        "environment_cache": launch.get("environment_cache"),  # env_cache= (files/pagecache.py environment())
        "staging": launch.get("staging"),  # env_stage=: the environment's copy (envstage.py), before the launch
        **_load_figures(record, load_bytes, load_s, phases, launch),
        "exit_code": launch.get("exit_code"), "machine_load": launch.get("machine_load"), "errors": ev.errors(record),
        "first_step": first["step"] if first else None, "first_step_loss": first["loss"] if first else None,
        "engine_load_statistics": _engine_load_statistics(record),
        "load_breakdown": (load_breakdown := breakdown.load(record, measured, root)),
        "storage_read_throughput_mib_s": ((load_breakdown or {}).get("storage_read") or {}).get("throughput_mib_s"),
        "memory": breakdown.memory(record, MEMORY_PHASES_RESTART),
        "stragglers": breakdown.stragglers(per_rank, PHASE_NAMES), "placement": order, "per_node": nodes,
        "slowest_node": placement.slowest(nodes, "total_seconds") if nodes else None,
        "trace": trace.summarize(run_dir / "traces" / name, record, list(MEMORY_PHASES_RESTART)) if run_dir else None,
        "per_rank": [{"rank": r["rank"], "marks": r["marks"], "verify_seconds": round(r["verify"]["seconds"], 6)
                      if r["verify"] else None, "phases": {k: round(v, 6) for k, v in r["phases"].items()}}
                     for r in per_rank],
        "launch_start": launch.get("start")}


def _rank_restart(rank: int, evs: list[dict]) -> dict:
    """One rank's restart: its phases and total (less its verification digest, and the load's untimed seconds),
    what it loaded, its peak RSS."""
    m = ev.marks(evs)
    verify = next((e for e in evs if e["event"] == "verify"), None)
    loaded = next((e for e in evs if e["event"] == "loaded"), None)
    left_out = {"first_step": verify["seconds"] if verify else 0.0,
                "checkpoint_load": (loaded or {}).get("untimed_seconds") or 0.0}
    phases = {phase: m[b] - m[a] - left_out.get(phase, 0.0) for phase, a, b in RESTART_PHASES if a in m and b in m}
    # an emulated restart trains no step: its total ends when the checkpoint is loaded (a rank that finished
    # without a first step); a rank stopped before its end point has no total
    end = "first_step_done" if "first_step_done" in m else "checkpoint_loaded" if "finished" in m else None
    total = (m[end] - m["process_start"] - left_out["checkpoint_load"] -
             (left_out["first_step"] if end == "first_step_done" else 0.0) if end in m and "process_start" in m else None)
    done = next((e for e in evs if e["event"] == "done"), {})
    return {"rank": rank, "phases": phases, "marks": m, "max_rss_bytes": done.get("max_rss_bytes"),
            "total_seconds": total, "verify": verify,
            "process_start": m.get("process_start"), "tag": loaded["tag"] if loaded else None,
            "load_seconds": sum(f["seconds"] for f in loaded["files"]) if loaded else None}


def _engine_load_statistics(record: dict[int, list[dict]]) -> dict | None:
    """The engines' own accounts of the restart's load (CheckpointIO.load_statistics): counts summed over ranks;
    anything else (a decision its data-parallel group took together, say) as the lowest rank recorded it."""
    stats = [e["engine_statistics"] for _, evs in sorted(record.items()) for e in evs
             if e["event"] == "loaded" and e.get("engine_statistics")]
    if not stats:
        return None
    out = {}
    for k in dict.fromkeys(k for s in stats for k in s):
        values = [s[k] for s in stats if k in s]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        out[k] = sum(values) if numbers else values[0]
    return out


def build(run_dir: Path, spec: dict, status: dict, ckpt: dict, inventory: dict | None,
          restarts: list[dict]) -> dict:
    checkpoint_record = ev.read_record(run_dir, "checkpoint")
    save_list = saves(checkpoint_record, ckpt.get("committed", {}), ckpt.get("root"))
    lost = training_cost.per_save(checkpoint_record, save_list)  # each save's training_lost, and the run's
    memory = save_memory.per_save(checkpoint_record, save_list)  # each save's memory, and the run's
    last = save_list[-1] if save_list else None
    # the saved checkpoint the last restart read (a restart at another layout reads a converted copy of it)
    loaded_tag = restarts[-1]["saved_tag"] if restarts and restarts[-1]["saved_tag"] else (last or {}).get("tag")
    loaded = next((s for s in save_list if s["tag"] == loaded_tag), last)
    by_rank = [v["bytes"] for k, v in (inventory or {}).get("by_rank", {}).items() if k != "unknown"]
    checkpoint = {
        "root": ckpt.get("root"), "dir": inventory["dir"] if inventory else None, "tag": loaded_tag,
        "files": inventory["total_files"] if inventory else 0, "bytes": inventory["total_bytes"] if inventory else 0,
        "by_kind": inventory["by_kind"] if inventory else {},
        "bytes_per_rank": {"max": max(by_rank), "min": min(by_rank), "mean": round(statistics.mean(by_rank), 1)}
        if by_rank else None,
        "saves": save_list, "training_lost": lost, "memory": memory,
        "engine_staging": resolve.engine_class(spec["engine"]).records.staging(checkpoint_record),
        "throughput_mib_s": loaded["throughput_mib_s"] if loaded else None,
        "placement": placement.placement(checkpoint_record),
        "trace": trace.summarize(run_dir / "traces" / "checkpoint", checkpoint_record, list(MEMORY_PHASES_CHECKPOINT)),
        # the phase's I/O by source, start-up and training with its saves (results/io_sources.py)
        "io_sources": io_sources.by_phase(checkpoint_record, MEMORY_PHASES_EMULATED if spec.get("emulate")
                                          else MEMORY_PHASES_CHECKPOINT, spec.get("io_sources"))}
    summary = {"schema_version": SCHEMA_VERSION, "run_id": run_dir.name, "status": status, "spec": spec,
               "checkpoint": checkpoint, "training": training(checkpoint_record, bool(spec.get("emulate"))),
               "restart": restarts[-1] if restarts else None, "restarts": restarts}
    # the best checkpoint interval for what the run measured, at its failure rate (its MTBF keys, docs/goodput.md)
    summary["goodput"] = goodput.from_summary(summary)
    return summary
