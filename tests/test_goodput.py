"""Goodput under failures: the model and its optimum interval (results/goodput.py, pure), the failure campaign's bad
input, and one real campaign on `tiny` (campaigns/endure.py): several failures, one inside a save, every restart
verified, badput adding up to the wall time, the final state equal to a failure-free run's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from restart_harness.results import goodput as g
from restart_harness.schema import BADPUT_BUCKETS


def test_optimum_agrees_with_young_daly_where_saves_are_cheap():
    for save, mtbf in ((1.0, 10_000.0), (0.1, 3_600.0), (30.0, 1e6)):
        o = g.optimum(save, 0.0, 0.01, mtbf)
        assert o["best_interval_seconds"] == pytest.approx(o["young_daly_interval_seconds"], rel=0.03)
        assert o["goodput_at_best"] >= o["goodput_at_young_daly"] - 1e-12


def test_optimum_departs_from_young_daly_where_saves_are_costly():
    o = g.optimum(300.0, 600.0, 1.0, 1_000.0)  # a save a third of the MTBF: first order is off
    assert o["goodput_at_best"] > o["goodput_at_young_daly"]
    ratio = o["best_interval_seconds"] / o["young_daly_interval_seconds"]
    assert abs(ratio - 1) > 0.1


def test_goodput_rises_to_the_optimum_then_falls():
    o = g.optimum(10.0, 120.0, 0.5, 3_600.0)
    best = o["best_interval_seconds"]
    below = [g.expected_goodput(best * f, 10.0, 120.0, 3_600.0) for f in (0.05, 0.2, 0.5, 0.9, 1.0)]
    above = [g.expected_goodput(best * f, 10.0, 120.0, 3_600.0) for f in (1.0, 1.1, 2.0, 5.0, 20.0)]
    assert below == sorted(below) and above == sorted(above, reverse=True)
    assert 0 < o["goodput_at_best"] < 1 and o["best_interval_steps"] == round(best / 0.5) or abs(
        o["best_interval_steps"] - best / 0.5) < 1


def test_failure_rate_scales_with_the_gpus():
    one = g.job_mtbf_seconds(g.DEFAULT_MTBF_PER_GPU_SECONDS, 1)
    assert g.job_mtbf_seconds(units=16_384) == pytest.approx(54 * 86_400 / 419)  # Llama 3: one every ~3.1 h
    assert g.job_mtbf_seconds(one, 1_000) * 1_000 == pytest.approx(one)
    small, large = (g.optimum(5.0, 300.0, 1.0, g.job_mtbf_seconds(units=n)) for n in (1_024, 4_096))
    assert large["best_interval_seconds"] == pytest.approx(small["best_interval_seconds"] / 2, rel=0.05)
    assert large["goodput_at_best"] < small["goodput_at_best"]
    assert "Llama 3" in g.DEFAULT_MTBF_SOURCE


def test_a_predictions_phases_give_the_interval_at_its_gpus_and_at_scale():
    phases = {"save_blocking_seconds": {"seconds": 20.0}, "restart_total_with_launch_seconds": {"seconds": 300.0},
              "restart_first_step_seconds": {"seconds": 2.0}}
    mine, large = g.from_phases(phases, {}, 64)
    assert mine["gpus"] == 64 and large["job_mtbf_seconds"] == pytest.approx(54 * 86_400 / 419)
    assert large["best_interval_seconds"] < mine["best_interval_seconds"] and "Llama 3" in large["mtbf_source"]
    assert "16,384 GPUs" in g.line(large) and "expected goodput" in g.line(large)
    assert g.from_phases({**phases, "save_blocking_seconds": {"seconds": None}}, {}, 64) == []


def test_a_runs_summary_gives_the_interval_at_its_ranks_and_at_the_scale_asked():
    summary = {"spec": {"derived": {"world_size": 2}, "at_gpus": 1_024}, "restart": {"total_seconds": 12.0},
               "checkpoint": {"training_lost": {"per_save_seconds_median": 0.05, "baseline_step": {"seconds": 0.06}}}}
    mine, large = g.from_summary(summary)
    assert (mine["gpus"], large["gpus"]) == (2, 1_024) and mine["save_seconds"] == 0.05
    assert large["job_mtbf_seconds"] == pytest.approx(mine["job_mtbf_seconds"] / 512)
    assert large["best_interval_seconds"] < mine["best_interval_seconds"]
    assert g.from_summary({"spec": {}, "restart": None, "checkpoint": {}}) == []


@pytest.mark.parametrize("keys,at_8,at_64,says", [
    ({"mtbf": 3_600.0}, 3_600.0, 450.0, "mtbf=3,600 s at 8 GPUs"),  # the job's, the same rate per GPU elsewhere
    ({"mtbf_per_node": 86_400.0, "ranks_per_node": 4}, 43_200.0, 5_400.0, "mtbf_per_node=86,400 s"),
    ({"mtbf_per_gpu": 80_000.0}, 10_000.0, 1_250.0, "mtbf_per_gpu=80,000 s"),
])
def test_each_mtbf_key_scales_the_jobs_failure_rate(keys, at_8, at_64, says):
    assert g.job_mtbf_at(keys, 8, 8) == (pytest.approx(at_8), says)
    assert g.job_mtbf_at(keys, 64, 8)[0] == pytest.approx(at_64)


def test_simulated_campaigns_converge_on_the_expectation_and_short_ones_spread():
    """The finite-campaign simulation (the benchmark's spread) is the model's own process: over a long campaign its
    goodput is Daly's expectation; without failures it is the intervals' share after the first start-up."""
    args = {"first": 0.0, "interval": 10.0, "save": 1.0, "restart": 5.0, "mtbf": 60.0}
    long = g.campaign_spread(200_000.0, **args, runs=20)
    expected = g.expected_goodput(10.0, 1.0, 5.0, 60.0)
    assert long["mean"] == pytest.approx(expected, abs=0.01) and long["p95"] - long["p5"] < 0.02
    short = g.campaign_spread(300.0, **args, runs=400)
    assert short["p5"] < expected < short["p95"] and short["p95"] - short["p5"] > 0.1
    quiet = g.campaign_spread(1_000.0, 100.0, 10.0, 1.0, 5.0, 1e12, runs=5)
    assert quiet["mean"] == pytest.approx(900 / 1_000 * 10 / 11, abs=0.01)


def test_a_campaign_with_slowed_launches_is_no_check_of_the_model_and_says_which():
    """The model takes one step time: a launch stepping over SLOWED times the campaign's median (other work on the
    machine) makes the comparison not a check, naming the launch, its step, the CPU share and its wall time."""
    buckets = dict.fromkeys(BADPUT_BUCKETS, 0.0) | {"startup_seconds": 3.0}

    def launch(record, step, other, wall=10.0):
        return {"record": record, "wall_seconds": wall, "step_seconds_median": step, "other_cpu_fraction": other,
                "productive_seconds": 5.0, **buckets}

    doc = {"goodput": g.totals([dict(buckets, productive_seconds=5.0)] * 3, 30.0), "step_seconds_median": 0.05,
           "saves_committed": 6, "wall_seconds": 30.0, "mtbf_seconds": 10.0, "failures": [{}, {}],
           "launches": [launch("checkpoint", 0.05, 0.0), launch("restart-01", 0.06, 0.1), launch("restart-02", 0.05, 0.0)]}
    assert g.campaign_model(doc, 5)["not_comparable"] is None
    doc["launches"][1] = launch("restart-01", 1.25, 0.83, wall=12.5)
    why = g.campaign_model(doc, 5)["not_comparable"]
    assert why.startswith("1 of 3 launches (restart-01) stepped at a median of 1.25 to 1.25 s") and "83%" in why
    assert "12.5 s of its wall time" in why, why
    steady = g.campaign_model(doc, 5)["steady"]  # the check on the two launches at the campaign's pace
    assert steady["launches"] == 2 and steady["wall_seconds"] == 20.0 and steady["measured_goodput"] == 0.5


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
def test_model_refuses_an_mtbf_that_is_not_a_positive_finite_time(value):
    with pytest.raises(ValueError, match="mtbf_seconds"):
        g.job_mtbf_seconds(value, 8)


BAD = [
    (["duration=60", "mtbf=0"], "mtbf=0: must be a positive number"),
    (["duration=60", "mtbf=-90s"], "mtbf=-90s: not a time; accepted: seconds, or a number with s, m, h or d"),
    (["duration=60", "mtbf=inf"], "mtbf=inf: not a time; accepted"),
    (["duration=60", "mtbf=nan"], "mtbf=nan: not a time; accepted"),
    (["duration=0s", "mtbf=60"], "duration=0s: must be a positive number"),
    (["duration=2", "mtbf=60"], "duration=2 s is too short for one save"),
    (["duration=60", "mtbf=30", "save_interval=100000"], "save_interval=100000: 100000 steps take at least"),
    (["duration=60", "mtbf=1s"], "no checkpoint would commit between failures and the job would never make progress"),
    (["duration=60", "mtbf=30", "failures=node"], "failures=node: accepted: a comma list of rank, job, save"),
    (["duration=60", "mtbf=30", "mtbf_per_gpu=9d"], "mtbf=30 and mtbf_per_gpu=777600: one failure rate"),
    (["mtbf=30"], "endure needs duration="),
    (["duration=60"], "endure needs mtbf="),
]


@pytest.mark.parametrize("args,says", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_endure_input_is_one_line_and_creates_nothing(tmp_path, args, says):
    results = tmp_path / "results"
    proc = run_cli(["endure", "tiny", *args], results, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not results.exists()


@pytest.mark.slow
def test_a_campaign_with_failures_verifies_every_restart_and_ends_in_the_failure_free_state(tmp_path):
    results = tmp_path / "results"
    # seed 5 draws failures 0.98, 1.59, 1.83, 1.05 MTBFs apart: a save failure (placed after the first commit), then
    # a rank's, each restart given time to verify; how many fit the budget depends on how fast launches start here
    proc = run_cli(["endure", "tiny", "duration=50", "mtbf=10", "save_interval=2", "seed=5", "failures=save,rank,job"],
                   results, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = Path(proc.stdout.strip().splitlines()[-1])
    doc = json.loads((folder / "endure.json").read_text())
    assert doc["state"] == "complete" and len(doc["failures"]) >= 2, doc["failures"]
    kinds = {f["kind"] for f in doc["failures"]}
    assert kinds >= {"save", "rank"}, kinds
    for f in doc["failures"]:
        if f["kind"] == "save":  # the save it died in never committed: the restart used the checkpoint before it
            assert f["save_committed"] is False and 0 < f["committed_step_after"] < f["save_step"], f
    restarts = doc["restarts"]
    # one restart per failure, but for a failure in the budget's last second (nothing left to restart for)
    assert len(doc["failures"]) - 1 <= restarts["launched"] <= len(doc["failures"]) and restarts["differing"] == 0
    assert restarts["verified"] + restarts["killed_before_verifying"] + restarts["fresh"] == restarts["launched"]
    assert restarts["verified"] >= 1
    gp = doc["goodput"]
    total = gp["productive_seconds"] + sum(gp["badput_seconds"][k] for k in BADPUT_BUCKETS)
    assert total == pytest.approx(gp["wall_seconds"], rel=0.02) and gp["sum_error"] < 0.02
    assert 0 < gp["goodput"] < 1 and gp["badput_seconds"]["wasted_progress_seconds"] > 0
    assert doc["final_state"]["equal"], doc["final_state"]
    m = doc["model"]
    assert m and 0 < m["expected_goodput"] < 1 and 0 < m["expected_goodput_realized"] < 1
    assert m["realized_mtbf_seconds"] == pytest.approx(gp["wall_seconds"] / len(doc["failures"]))
    # the report: goodput against the checkpoint interval, the campaign's measured point on its curve
    report = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "analysis", str(folder), f"out_dir={report}"], capture_output=True,
                          text=True, check=False, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    png = (report / "goodput_by_checkpoint_interval_seconds.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "goodput_by_checkpoint_interval_seconds.png" in (report / "report.md").read_text()
