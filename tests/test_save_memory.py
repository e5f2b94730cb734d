"""What a save costs in host memory (restart_harness/results/save_memory.py, worker/memory.py): on records written out
by hand (the slope, its flag, no slope from too few saves, the cost beyond a step's own), then on a real run whose
rank 1 leaks 4 MiB at every save (RH_FAULT leak@save) and whose engine keeps staging buffers (engine=lazy).
Every run-table case's figures: tests/test_runs.py."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest
from conftest import events, load_summary, submit

from restart_harness.results import save_memory

MIB = 2**20


def save_event(tag, step, rss, peak=1 * MIB, held=0, retained=0, buffers=None):
    return {"event": "save", "tag": tag, "step": step,
            "memory": {"rss_before_bytes": rss, "peak_added_bytes": peak, "held_bytes": held,
                       "retained_bytes": retained, "engine_buffers": buffers}}


def step_event(n, added, in_flight=False):
    return {"event": "step", "step": n, "seconds": 1.0, "in_flight": in_flight, "rss_peak_added_bytes": added}


def test_a_leak_is_flagged_with_its_slope_and_drift_is_not():
    rng = random.Random(7)
    leaking = [save_event(f"s{i}", 2 * i, 400 * MIB + i * 4 * MIB + rng.randrange(-MIB // 4, MIB // 4))
               for i in range(1, 11)]
    drifting = [save_event(f"s{i}", 2 * i, 400 * MIB + i * 300 * 1024 + rng.randrange(-MIB // 8, MIB // 8))
                for i in range(1, 11)]
    g = save_memory.growth({0: drifting, 1: leaking})
    assert g["rank"] == 1 and g["growing"] is True and g["fitted_saves"] == 9 and g["saves"] == 10
    assert g["bytes_per_save"] == pytest.approx(4 * MIB, rel=0.05)
    flat = save_memory.growth({0: drifting})
    assert flat["growing"] is False and flat["bytes_per_save"] == pytest.approx(300 * 1024, rel=0.3)


def test_the_first_save_is_left_out_of_the_slope():
    # the first save allocates buffers the later ones reuse: a step, not a growth
    evs = [save_event("s1", 2, 400 * MIB)] + [save_event(f"s{i}", 2 * i, 500 * MIB) for i in range(2, 7)]
    g = save_memory.growth({0: evs})
    assert g["bytes_per_save"] == 0 and g["growing"] is False


def test_too_few_saves_for_a_slope_is_said_not_numbered():
    g = save_memory.growth({0: [save_event(f"s{i}", 2 * i, 400 * MIB + i * 8 * MIB) for i in range(1, 5)]})
    assert g["bytes_per_save"] is None and g["growing"] is None
    assert g["note"].startswith("a slope needs at least 5 saves and this phase made 4")


def test_a_save_whose_flush_overlapped_steps_costs_its_peak_less_a_steps_own():
    record = {0: [step_event(1, 30 * MIB), step_event(2, 2 * MIB), save_event("s2", 2, 400 * MIB, peak=9 * MIB),
                  step_event(3, 5 * MIB, in_flight=True), step_event(4, 2 * MIB),
                  save_event("s4", 4, 400 * MIB, peak=7 * MIB)],
              1: [save_event("s2", 2, 390 * MIB, peak=11 * MIB, held=3 * MIB), save_event("s4", 4, 390 * MIB)]}
    saves = [{"tag": "s2", "step": 2, "in_flight_steps": 1}, {"tag": "s4", "step": 4, "in_flight_steps": 0}]
    run = save_memory.per_save(record, saves)
    # the steps' own: the median of steps 2 and 4 (step 1 is warm-up, step 3 had a flush in flight)
    assert run["step_peak_added_bytes"] == 2 * MIB
    assert saves[0]["memory"]["peak_added_bytes"] == 11 * MIB and saves[0]["memory"]["rank"] == 1
    assert saves[0]["memory"]["cost_bytes"] == 9 * MIB  # overlapped a step: less the step's own
    assert saves[1]["memory"]["cost_bytes"] == 7 * MIB  # held no step: its peak
    assert run["peak_added_bytes_max"] == 11 * MIB and run["held_bytes_max"] == 3 * MIB
    assert run["peak_added_tag"] == "s2" and run["peak_added_rank"] == 1


@pytest.mark.slow
def test_a_leaking_rank_is_flagged_and_an_engines_buffers_are_counted(tmp_path):
    proc = submit(["tiny", "dp=2", "engine=lazy", "iters=12", "save_interval=2", "phase=checkpoint", "baseline=false",
                   "launcher=prefork", f"results_dir={tmp_path}"], tmp_path, timeout=600,
                  env={"RH_FAULT": "leak@save:rank=1:mib=4"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / proc.stdout.strip().splitlines()[-1].split("/")[-1]
    memory = load_summary(run_dir)["checkpoint"]["memory"]
    files = {r: [e for e in evs if e["event"] == "save"] for r, evs in events(run_dir).items()}
    per_save = 4 * MIB  # what rank 1 leaks at each save
    g = memory["growth"]
    assert g["growing"] is True and g["rank"] == 1 and g["saves"] == 6, g
    assert g["bytes_per_save"] >= 0.9 * per_save, g
    # save after save, rank 1 grew by what it leaked beyond rank 0, which leaks nothing (both drift alike: the
    # allocators, the harness's records); medians of the increments (a warm-up jump does not move them)
    steps = {r: statistics.median(b["memory"]["rss_before_bytes"] - a["memory"]["rss_before_bytes"]
                                  for a, b in itertools.pairwise(saves[1:])) for r, saves in files.items()}
    assert steps[1] - steps[0] == pytest.approx(per_save, rel=0.15), (steps, per_save)
    growth_line = next(line for line in proc.stdout.splitlines() if line.startswith("memory growth"))
    assert "GROWING" in growth_line and "rank 1" in growth_line, growth_line
    # engine=lazy keeps a staging buffer per part file it writes, counted by itself: its first save allocates and
    # fills them (resident by its commit), later saves reuse them
    for rank, saves in files.items():
        first = saves[0]["memory"]
        kept = first["engine_buffers"]["host_bytes"]
        parts = sum(f["bytes"] for f in saves[0]["files"] if f["path"].endswith(".bin"))
        assert parts > 0 and kept == pytest.approx(parts, rel=0.05), (rank, first, parts)
        assert first["peak_added_bytes"] >= 0.9 * kept, (rank, first)
    assert memory["engine_buffers_bytes_max"] == max(s[0]["memory"]["engine_buffers"]["host_bytes"]
                                                     for s in files.values())
    assert json.loads((run_dir / "summary.json").read_text())["status"]["state"] == "complete"
