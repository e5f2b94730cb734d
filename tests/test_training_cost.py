"""What a save costs training (restart_harness/results/training_cost.py), on timelines written out by hand: the
window from the save's start to the next save's, less the baseline steps it holds; windows that never overlap and
leave the harness's verification digest out; its parts; no number without a baseline. The same figures on real runs: tests/test_runs.py (every case) and benchmarks/compare_engines.py."""

from __future__ import annotations

import pytest

from restart_harness.results import training_cost


def step(n, seconds, end, in_flight=False):
    return {"event": "step", "step": n, "seconds": seconds, "t": end, "in_flight": in_flight, "loss": 1.0, "last": 5}


def save(tag, start, emitted):
    return {"event": "save", "tag": tag, "start": start, "t": emitted}


def entry(tag, n, blocking):
    return {"tag": tag, "step": n, "blocking_seconds": blocking}


def test_a_synchronous_save_costs_its_window_less_the_baseline_steps():
    # steps of 1 s (the first, warm-up, 2 s); saves after steps 2 and 4, each blocking 0.5 s and durable by 0.6 s
    record = {0: [step(1, 2.0, 2.0), step(2, 1.0, 3.0), save("s2", 3.01, 3.6), step(3, 1.0, 4.6), step(4, 1.0, 5.6),
                  save("s4", 5.61, 6.2)]}
    saves = [entry("s2", 2, 0.5), entry("s4", 4, 0.5)]
    run = training_cost.per_save(record, saves)
    assert run["baseline_step"] == {"seconds": 1.0, "steps": 3, "mad_seconds": 0.0}
    first, last = saves[0]["training_lost"], saves[1]["training_lost"]
    # 3.01 -> 5.61 holds steps 3 and 4: 2.6 - 2 x 1.0; the durable part and the polls are the 0.1 beyond blocking
    assert first["seconds"] == pytest.approx(0.6) and first["steps_in_window"] == 2
    assert first["other_seconds"] == pytest.approx(0.1) and first["overlapped_extra_seconds"] == 0
    # the last save: from its start to the end of its blocking part (5.61 + 0.5); its commit 0.09 s later is after
    # training
    assert last["seconds"] == pytest.approx(0.5) and last["after_training_wait_seconds"] == pytest.approx(0.09)
    assert run["total_seconds"] == pytest.approx(1.1) and run["per_save_seconds_median"] == pytest.approx(0.55)


def test_an_asynchronous_save_is_charged_for_the_steps_its_flush_slowed():
    # blocking 0.1 s; its flush overlaps step 3 (1.5 s instead of 1.0) and is waited for 0.1 s before the next save
    record = {0: [step(1, 2.0, 2.0), step(2, 1.0, 3.0), save("s2", 3.0, 5.65), step(3, 1.5, 4.6, in_flight=True),
                  step(4, 1.0, 5.6), save("s4", 5.7, 7.0), step(5, 1.5, 7.3, in_flight=True)]}
    saves = [entry("s2", 2, 0.1), entry("s4", 4, 0.1)]
    training_cost.per_save(record, saves)
    first = saves[0]["training_lost"]
    assert first["seconds"] == pytest.approx(0.7)  # 5.7 - 3.0 - 2 x 1.0
    assert (first["blocking_seconds"], first["overlapped_steps"]) == (0.1, 1)
    assert first["overlapped_extra_seconds"] == pytest.approx(0.5) and first["other_seconds"] == pytest.approx(0.1)
    # 5.7 -> 7.3 holds step 5: 1.6 - 1.0; the 0.1 s the first save's flush was waited for before it is the first's
    last = saves[1]["training_lost"]
    assert last["seconds"] == pytest.approx(0.6) and last["overlapped_extra_seconds"] == pytest.approx(0.5)
    assert last["other_seconds"] == pytest.approx(0.0)


def test_windows_never_overlap_and_leave_the_verification_digest_out():
    """Every moment after the first save's start is in one save's window at most: the saves' losses add up to the
    phase's wall time less its steps at the baseline and the harness's digests (0.3 s before each save here)."""
    record = {0: [step(1, 2.0, 2.0), step(2, 1.0, 3.0), {"event": "digest", "tag": "s2", "seconds": 0.3},
                  save("s2", 3.3, 6.1), step(3, 1.5, 4.9, in_flight=True), step(4, 1.0, 5.9),
                  {"event": "digest", "tag": "s4", "seconds": 0.3}, save("s4", 6.4, 7.9),
                  step(5, 1.5, 8.0, in_flight=True), step(6, 1.0, 9.0)]}
    saves = [entry("s2", 2, 0.1), entry("s4", 4, 0.1)]
    run = training_cost.per_save(record, saves)
    first, last = saves[0]["training_lost"], saves[1]["training_lost"]
    # s2: 3.3 -> 6.1 (s4's digest starts at 6.4 - 0.3; s2's flush was waited for 5.9 -> 6.1): 2.8 - 2 x 1.0
    assert first["seconds"] == pytest.approx(0.8) and first["digest_seconds"] == pytest.approx(0.3)
    assert last["seconds"] == pytest.approx(2.6 - 2 * 1.0)  # 6.4 -> 9.0 holds steps 5 and 6
    span = 9.0 - 3.3 - 0.3  # the first save's start to the end, less the second save's digest
    assert run["total_seconds"] == pytest.approx(span - 4 * 1.0)


def test_no_number_without_a_step_free_of_saves():
    # a save at every step: each step after the first had a flush in flight
    record = {0: [step(1, 2.0, 2.0), save("s1", 2.0, 3.5), step(2, 1.5, 3.6, in_flight=True), save("s2", 3.6, 4.0),
                  step(3, 1.5, 5.2, in_flight=True), save("s3", 5.2, 5.9)]}
    saves = [entry("s1", 1, 0.1), entry("s2", 2, 0.1), entry("s3", 3, 0.1)]
    run = training_cost.per_save(record, saves)
    assert run["per_save_seconds_median"] is None and run["total_seconds"] is None and "warm-up" in run["note"]
    assert all(s["training_lost"] == {"seconds": None, "note": run["note"]} for s in saves)
