"""What each save costs training: the wall time training lost to it, against the run's own steps with no save in
flight (docs/measurements.md, "Training time lost per save").

A save at step k costs training the wall time from its start (after step k) to the start of the next save (or, for the
last save, to the end of the last step, or of its own blocking part if later), less the time the steps in that window
would have taken without checkpointing: their count times the baseline step. The baseline is the median of the
phase's steps that had no flush in flight, its first step (warm-up) left out. The window holds the save's blocking
part, every step its background work overlapped, the wait for its flush before the next save and the commit's
per-step polls, so an asynchronous engine is charged for what its flush slows down, not only for its blocking
return. The windows do not overlap: the wait for a save's flush before the next save is in its own window only (until
2026-11-27 each window began at the end of its step, so that wait was counted in two), and the harness's verification
digest taken just before each save (`digest_seconds`) is in none: it is the harness's, not the engine's.

A save's figure is within the noise when it is smaller than what the window's steps vary by themselves: 2 standard
deviations of the sum of their deviations from the baseline, 3 x MAD x sqrt(steps in the window) (a MAD is about 0.67
of a standard deviation). Such a figure, negative ones included, says the save cost nothing measurable here.

Rank 0's timeline: the ranks step in lockstep (every step ends in collectives), so rank 0's window includes waiting
for the slowest rank. The blocking part is the slowest rank's (the next step cannot start before it returns)."""

from __future__ import annotations

import math
import statistics

from restart_harness.results import events as ev

NO_BASELINE = ("no step without a save in flight besides the first (warm-up): nothing to measure a save's cost "
               "against; give the run more iters between saves, or compare with engine=none (benchmarks/"
               "compare_engines.py)")


NOISE_MADS = 3.0  # 2 standard deviations of a sum of step deviations, in MADs (about 0.67 sigma each)


def _r(x: float) -> float:
    return round(x, 6)


def baseline(steps: list[dict]) -> dict:
    """The step time without checkpointing: median and spread of the steps with no flush in flight, the first left
    out; `seconds` None when there is none."""
    first = min((s["step"] for s in steps), default=None)
    clean = [s["seconds"] for s in steps if not s.get("in_flight") and s["step"] != first]
    if not clean:
        return {"seconds": None, "steps": 0, "mad_seconds": None}
    med = statistics.median(clean)
    return {"seconds": _r(med), "steps": len(clean), "mad_seconds": _r(statistics.median(abs(x - med) for x in clean))}


def per_save(record: dict[int, list[dict]], save_list: list[dict]) -> dict:
    """Adds `training_lost` to each entry of save_list (in place) and returns the run's figures."""
    steps = sorted(ev.of_kind(record, "step").get(0, []), key=lambda s: s["step"])
    mine = {e["tag"]: e for e in ev.of_kind(record, "save").get(0, [])}
    base = baseline(steps)
    ordered = sorted((s for s in save_list if s["tag"] in mine), key=lambda s: s["step"])
    if not ordered or not steps:
        return {"baseline_step": base, "saves": 0, "per_save_seconds_median": None, "total_seconds": None,
                "note": None if not ordered else "the phase trained no step"}
    if base["seconds"] is None:
        for s in ordered:
            s["training_lost"] = {"seconds": None, "note": NO_BASELINE}
        return {"baseline_step": base, "saves": len(ordered), "per_save_seconds_median": None, "total_seconds": None,
                "note": NO_BASELINE}
    end_of_step = {s["step"]: s["t"] for s in steps}
    digests = {e["tag"]: e["seconds"] for e in ev.of_kind(record, "digest").get(0, [])}
    b = base["seconds"]
    lost = []
    for i, save in enumerate(ordered):
        k, own = save["step"], mine[save["tag"]]
        if k not in end_of_step:
            continue
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        last_step = nxt["step"] if nxt else steps[-1]["step"]
        between = [s for s in steps if k < s["step"] <= last_step]
        if nxt:  # up to the next save's digest: its wait for this save's flush is this save's
            end = mine[nxt["tag"]]["start"] - digests.get(nxt["tag"], 0.0)
        else:
            end = max(steps[-1]["t"], own["start"] + save["blocking_seconds"])
        window = end - own["start"]
        seconds = window - len(between) * b
        overlapped = sum(s["seconds"] - b for s in between if s.get("in_flight"))
        noise = NOISE_MADS * (base["mad_seconds"] or 0.0) * math.sqrt(max(1, len(between)))
        entry = {
            "seconds": _r(seconds),
            "noise_seconds": _r(noise),
            "within_noise": abs(seconds) < noise,
            "blocking_seconds": save["blocking_seconds"],
            "overlapped_steps": sum(1 for s in between if s.get("in_flight")),
            "overlapped_extra_seconds": _r(overlapped),
            "other_seconds": _r(seconds - save["blocking_seconds"] - overlapped),
            "window_seconds": _r(window),
            "steps_in_window": len(between),
            "digest_seconds": _r(digests.get(save["tag"], 0.0)),
        }
        if not nxt:  # the flush of the last save, waited for once training had ended: the job's, not training's
            entry["after_training_wait_seconds"] = _r(max(0.0, own["t"] - end))
        save["training_lost"] = entry
        lost.append(seconds)
    noise = statistics.median(s["training_lost"]["noise_seconds"] for s in ordered if "seconds" in s["training_lost"]) \
        if lost else None
    median = statistics.median(lost) if lost else None
    return {"baseline_step": base, "saves": len(lost),
            "per_save_seconds_median": _r(median) if lost else None,
            "per_save_noise_seconds": _r(noise) if noise is not None else None,
            "within_noise": bool(lost) and abs(median) < noise,
            "total_seconds": _r(sum(lost)) if lost else None, "note": None}
