"""What each save costs training: the wall time from its start to the next save's, less its steps at the baseline
step (the median step with no flush in flight), with its noise (3 x MAD x sqrt(steps)). Defined in full in
docs/measurements.md, "Training time lost per save"."""

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
        entry = {"seconds": _r(seconds), "noise_seconds": _r(noise), "within_noise": abs(seconds) < noise,
                 "blocking_seconds": save["blocking_seconds"],
                 "overlapped_steps": sum(1 for s in between if s.get("in_flight")),
                 "overlapped_extra_seconds": _r(overlapped),
                 "other_seconds": _r(seconds - save["blocking_seconds"] - overlapped), "window_seconds": _r(window),
                 "steps_in_window": len(between), "digest_seconds": _r(digests.get(save["tag"], 0.0))}
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
