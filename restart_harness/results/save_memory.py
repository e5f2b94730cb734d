"""What each save costs in host memory, and whether the resident set grows save after save (a least-squares slope from
the second save), from the ranks' records (worker/memory.py) into summary.json: docs/measurements.md, "Memory per
save"."""

from __future__ import annotations

import math
import statistics

from restart_harness.results import events as ev

MIN_SAVES = 5  # four fitted points after the first save: two degrees of freedom left for the slope's error
GROWTH_T = 3.0
GROWTH_FLOOR_BYTES = 1 << 20  # per save
FIGURES = ("peak_added_bytes", "held_bytes", "retained_bytes")


def slope(points: list[tuple[float, float]]) -> tuple[float, float | None]:
    """Least-squares slope of y on x and its standard error (None with fewer than 3 points)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    if n < 3:
        return b, None
    ssr = sum((y - my - b * (x - mx)) ** 2 for x, y in points)
    return b, math.sqrt(ssr / (n - 2) / sxx)


def growth(per_rank: dict[int, list[dict]]) -> dict:
    """The resident set at each save's start, save after save: the steepest rank's slope (bytes per save)."""
    n = max((len(v) for v in per_rank.values()), default=0)
    if n < MIN_SAVES:
        return {"saves": n, "bytes_per_save": None, "growing": None,
                "note": f"a slope needs at least {MIN_SAVES} saves and this phase made {n}: give it more iters "
                        "(e.g. iters = 10 x save_interval)"}
    best = _steepest({rank: [(i, e["memory"]["rss_before_bytes"])
                             for i, e in enumerate(sorted(evs, key=lambda e: e["step"]))
                             if i > 0 and e.get("memory") and e["memory"].get("rss_before_bytes") is not None]
                      for rank, evs in per_rank.items()})
    if best is None:
        return {"saves": n, "bytes_per_save": None, "growing": None, "note": "no rank recorded its memory"}
    b, se, rank, points = best
    t = math.inf if not se and b > 0 else (b / se if se else 0.0)
    return {"saves": n, "fitted_saves": len(points), "rank": rank, "bytes_per_save": round(b),
            "standard_error_bytes": round(se) if se is not None else None,
            "growth_bytes": round(b * (len(points) - 1)), "first_fitted_rss_bytes": points[0][1],
            "growing": bool(b >= GROWTH_FLOOR_BYTES and t >= GROWTH_T), "note": None}


def training_growth(record: dict[int, list[dict]]) -> dict | None:
    """The resident set at each step's start, step after step, from the second step on: how training's own memory
    moves (with a save's growth in it where saves were made; engine=none's runs give it without). The steepest rank,
    in bytes per step; None with fewer than MIN_SAVES steps recorded."""
    best = _steepest({rank: [(e["step"], e["rss_bytes"]) for e in sorted(evs, key=lambda e: e["step"])[1:]
                             if e.get("rss_bytes") is not None] for rank, evs in ev.of_kind(record, "step").items()})
    if best is None:
        return None
    b, se, rank, points = best
    return {"bytes_per_step": round(b), "standard_error_bytes": round(se) if se is not None else None, "rank": rank,
            "steps": len(points)}


def _steepest(points_by_rank: dict[int, list[tuple[float, float]]]) -> tuple | None:
    """(slope, its standard error, rank, points) of the rank whose points rise the steepest, of those with at least
    MIN_SAVES - 1 points; None where none has."""
    fits = [(*slope(points), rank, points) for rank, points in points_by_rank.items() if len(points) >= MIN_SAVES - 1]
    return max(fits, key=lambda f: f[0], default=None)


def per_save(record: dict[int, list[dict]], save_list: list[dict]) -> dict | None:
    """Adds `memory` to each entry of save_list (in place) and returns the run's figures (None: nothing recorded)."""
    saves = ev.of_kind(record, "save")
    if not any(e.get("memory") for evs in saves.values() for e in evs):
        return None
    # the training's own transient host memory: the median of its steps' peak over start with no flush in flight,
    # the first step (warm-up) left out
    steps = ev.of_kind(record, "step").get(0, [])
    first = min((s["step"] for s in steps), default=None)
    clean = [s["rss_peak_added_bytes"] for s in steps
             if not s.get("in_flight") and s["step"] != first and s.get("rss_peak_added_bytes") is not None]
    step_added = int(statistics.median(clean)) if clean else None
    by_tag: dict[str, list[tuple[int, dict]]] = {}
    for rank, evs in saves.items():
        for e in evs:
            if e.get("memory"):
                by_tag.setdefault(e["tag"], []).append((rank, e))
    for save in save_list:
        ranks = by_tag.get(save["tag"])
        if not ranks:
            continue
        entry: dict = {}
        for f in FIGURES:
            value, rank = max(((e["memory"][f], r) for r, e in ranks if e["memory"].get(f) is not None),
                              default=(None, None))
            entry[f] = value
            if f == "peak_added_bytes":
                entry["rank"] = rank
        overlapped = save.get("in_flight_steps", 0) > 0
        peak = entry["peak_added_bytes"]
        entry["cost_bytes"] = (None if peak is None else peak - step_added if overlapped and step_added is not None
                               else peak)
        buffers = [e["memory"]["engine_buffers"] for _, e in ranks if e["memory"].get("engine_buffers")]
        entry["engine_buffers"] = ({k: max(b[k] for b in buffers) for k in buffers[0]} if buffers else None)
        devices = [e["memory"]["device"] for _, e in ranks if e["memory"].get("device")]
        if devices:
            entry["device"] = {f: max((d[f] for d in devices if d.get(f) is not None), default=None) for f in FIGURES}
        save["memory"] = entry
    top = max(((s["memory"]["peak_added_bytes"], s["memory"]["rank"], s["tag"]) for s in save_list
               if (s.get("memory") or {}).get("peak_added_bytes") is not None), default=(None, None, None))
    made = [s["memory"] for s in save_list if s.get("memory")]
    costs = [m["cost_bytes"] for m in made if m["cost_bytes"] is not None]
    return {
        "saves": len(costs), "peak_added_rank": top[1], "peak_added_tag": top[2], "step_peak_added_bytes": step_added,
        **{f"{f}_max": max((m[f] for m in made if m[f] is not None), default=None) for f in FIGURES},
        "cost_bytes_median": int(statistics.median(costs)) if costs else None,
        "engine_buffers_bytes_max": max(((s.get("memory") or {}).get("engine_buffers") or {}).get("host_bytes", 0)
                                        for s in save_list) or None,
        "growth": growth({r: [e for e in evs if e.get("memory")] for r, evs in saves.items()})}
