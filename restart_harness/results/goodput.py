"""A failure campaign's wall time, split (campaigns/endure.py): productive step time, and badput by category, named
after ml-goodput-measurement's buckets (schema BADPUT_BUCKETS; docs/goodput.md defines each).

Each launch (segment) is read from rank 0's events on one clock (wall time): start-up from the launch to
dist_init_done, training preparation to the engine's set-up (a fresh start) or to the load (a restart), checkpoint
restore from the load to its verification, then the step loop. In the loop, a step's median time is productive unless
the step was lost (after the last commit when a failure ended the launch: wasted progress, recomputed by the next
launch); the first step's excess over the median is first steps; the loop's time outside steps is checkpoint save
(the training lost to saves: their blocking parts, digests, the commit's wait). A launch cut by a failure puts the
time from its last event to its end with the phase that was running (wasted progress in the step loop). Other is
the rest of the wall time: the harness between launches and each launch's teardown."""

from __future__ import annotations

import statistics

from restart_harness.results import events as ev
from restart_harness.schema import BADPUT_BUCKETS


def _boundaries(events: list[dict], start: float) -> list[float | None]:
    """The ends of start-up, training preparation and checkpoint restore on rank 0's clock (None: not reached)."""
    marks = ev.marks(events)
    dist = marks.get("dist_init_done")
    loaded = next((e["outer_start"] for e in events if e["event"] == "loaded"), None)
    verified = next((e["t"] for e in events if e["event"] == "verify"), None)
    prepared = marks.get("engine_initialized", loaded)
    restored = verified if loaded is not None else prepared
    return [dist, prepared, restored]


def segment(run_dir, record: str, launch: dict, lost_after: int | None, step_median: float | None) -> dict:
    """One launch's seconds by bucket, with `productive_seconds`. `lost_after`: the last committed step when a
    failure ended the launch (steps after it are wasted progress), None when it was not ended by a failure."""
    events = sorted(ev.read_record(run_dir, record).get(0, []), key=lambda e: e["t"])
    start, end = launch["start"], launch["start"] + launch["wall_seconds"]
    out = dict.fromkeys(BADPUT_BUCKETS, 0.0) | {"productive_seconds": 0.0}
    edges, names = _boundaries(events, start), BADPUT_BUCKETS[:2] + ("checkpoint_restore_seconds",)
    at = start
    for name, edge in zip(names, edges):
        if edge is None:  # the launch ended in this phase
            out[name] += max(0.0, end - at)
            return out
        out[name] += max(0.0, min(edge, end) - at)
        at = min(edge, end)
    steps = sorted((e for e in events if e["event"] == "step"), key=lambda e: e["step"])
    base = step_median or (statistics.median(s["seconds"] for s in steps) if steps else 0.0)
    for i, s in enumerate(steps):
        kept = s["seconds"] if i else min(base, s["seconds"])  # the first step's excess is first steps
        out["first_steps_seconds"] += s["seconds"] - kept
        lost = lost_after is not None and s["step"] > lost_after
        out["wasted_progress_seconds" if lost else "productive_seconds"] += kept
    loop_end = max((s["t"] for s in steps), default=at)
    out["checkpoint_save_seconds"] += max(0.0, loop_end - at - sum(s["seconds"] for s in steps))
    tail = max(0.0, end - max(loop_end, at))
    out["wasted_progress_seconds" if lost_after is not None else "other_seconds"] += tail
    return out


def step_median(run_dir, records: list[str]) -> float | None:
    """The median step time over every launch's steps but each launch's first (the campaign's baseline step)."""
    seconds = []
    for record in records:
        steps = sorted((e for e in ev.read_record(run_dir, record).get(0, []) if e["event"] == "step"),
                       key=lambda e: e["step"])
        seconds += [s["seconds"] for s in steps[1:]]
    return statistics.median(seconds) if seconds else None


def totals(segments: list[dict], wall_seconds: float) -> dict:
    """Goodput and badput over the campaign: each bucket in seconds and as a share of the wall time; `other` is the
    wall time the launches' measured buckets leave (negative only where they overlap: `sum_error`)."""
    summed = {k: sum(s[k] for s in segments) for k in (*BADPUT_BUCKETS, "productive_seconds")}
    measured = sum(summed.values())
    summed["other_seconds"] += wall_seconds - measured
    shares = {k.replace("_seconds", "_share"): (v / wall_seconds if wall_seconds else None)
              for k, v in summed.items()}
    return {"wall_seconds": wall_seconds, "goodput": shares.pop("productive_share"),
            "productive_seconds": summed.pop("productive_seconds"), "badput_seconds": summed, "badput_share": shares,
            "launches_measured_seconds": measured,
            # the launches' measured seconds beyond the wall time (overlap), as a share of it: 0 where they fit
            "sum_error": max(0.0, measured - wall_seconds) / wall_seconds if wall_seconds else None}
