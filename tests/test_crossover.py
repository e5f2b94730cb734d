"""The crossover (docs/prediction.md#the-crossover): the checkpoint size from which the predicted checkpoint load is
the largest restart phase. Checked against a calculation written here from the calibration's coefficients and the
model's terms as the docs state them (every phase a + b x checkpoint bytes along the family), not through
predict/model.py; then none-in-range, the run's side carried into its summary, and the report's figure."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from restart_harness.predict import crossover as cx
from restart_harness.predict import fit
from restart_harness.schema import CROSSOVER_LOAD, CROSSOVER_STATUSES, GIB

DATA = REPO / "tests" / "data" / "results"
# the groups a tiny run on this machine's CPUs takes its coefficients from (docs/prediction.md "fitted per")
GROUPS = {"restart_launch_seconds": "local", "restart_imports_seconds": "deepspeed",
          "restart_dist_init_seconds": "deepspeed", "restart_model_build_seconds": "deepspeed/cpu",
          "restart_engine_init_seconds": "deepspeed/cpu", CROSSOVER_LOAD: "deepspeed/default",
          "restart_first_step_seconds": "deepspeed/cpu"}
GIVEN = ("storage_read", "metadata_read", "environment_metadata")  # coefficient 1: the storage's own time


def predict(args: list[str], tmp_path: Path) -> dict:
    env = {**os.environ, "RH_CACHE_DIR": str(tmp_path / "cache")}  # no cached baseline: the storage is as given
    proc = subprocess.run([str(REPO / "submit-job.sh"), "predict", *args, "predict=json"], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def affine(f: dict, coefficients: dict) -> tuple[float, float]:
    """(seconds at no checkpoint, seconds per byte of checkpoint) of one phase along the family: each term's feature
    either stays (fixed, contention, ranks, files) or grows in proportion to the checkpoint (bytes, parameters)."""
    per = 1.0 / f["save_bytes"]
    stays = {"fixed": 1.0, "cpu": f["contention"], "spawn": f["ranks_per_node"], "world": f["world_size"],
             "read_files": f["read_files_max_rank"], "metadata_read": 0.0, "environment_metadata": 0.0}
    grows = {"parameters": f["parameters_per_rank"] * f["contention"] * per,
             "compute": f["parameters_per_rank"] * f["tokens_per_rank_step"] * f["contention"] * per,
             "storage_read": f["read_bytes"] / f["read_bytes_per_s"] * per,
             "deserialize": f["read_bytes_max_rank"] * f["contention"] * per}
    a = b = 0.0
    for term, c in coefficients.items():
        c = 1.0 if term in GIVEN else c
        assert term in stays or term in grows, f"a term this calculation does not know: {term}"
        a += c * stays.get(term, 0.0)
        b += c * grows.get(term, 0.0)
    return a, b


def by_hand(f: dict, calibration: dict, low: float, high: float) -> tuple[float | None, float | None]:
    """Where a_load + b_load B > a_i + b_i B for every other phase i: an interval of B (or none), cut to [low, high]."""
    lines = {p: affine(f, calibration["phases"][p][g]["coefficients"]) for p, g in GROUPS.items()}
    a_load, b_load = lines.pop(CROSSOVER_LOAD)
    start, end = low, high
    for a, b in lines.values():
        if b_load > b:
            start = max(start, (a - a_load) / (b_load - b))
        elif b_load < b:
            end = min(end, (a - a_load) / (b_load - b))
        elif a_load <= a:
            return None, None
    return (start, end) if start < end else (None, None)


@pytest.mark.parametrize("read_gbps", [0.5, 1, 1.5])
def test_the_crossover_is_where_the_calibrations_lines_meet(read_gbps, tmp_path):
    p = predict(["tiny", "write_gbps=1", f"read_gbps={read_gbps}", "cpus_per_node=2"], tmp_path)
    c = p["crossover"]
    start, end = by_hand(p["features"], fit.load("default"), cx.MIN_BYTES, cx.MAX_BYTES)
    assert c["status"] == "crosses" and start is not None and end == cx.MAX_BYTES
    assert c["crossover_checkpoint_bytes"] == pytest.approx(start, rel=1e-5)
    assert "load_largest_until_bytes" not in c
    # the load and the phase it overtakes take the same time there; just below, that phase is the largest
    at = c["seconds_at_crossover"]
    assert at[CROSSOVER_LOAD] == pytest.approx(at[c["overtakes"]], rel=1e-4)
    assert c["overtakes"] != CROSSOVER_LOAD and c["status"] in CROSSOVER_STATUSES


def test_faster_storage_moves_the_crossover_out(tmp_path):
    """A load that reads faster overtakes start-up at a larger checkpoint (and the text says where, in GiB)."""
    slow, fast = (predict(["tiny", "write_gbps=1", f"read_gbps={r}", "cpus_per_node=2"], tmp_path)["crossover"]
                  for r in (0.5, 1.5))
    assert slow["crossover_checkpoint_bytes"] < fast["crossover_checkpoint_bytes"]
    assert slow["seconds_per_gib"][CROSSOVER_LOAD] > fast["seconds_per_gib"][CROSSOVER_LOAD]
    assert f"{slow['crossover_checkpoint_bytes'] / GIB:,.2f} GiB" in cx.headline(slow)


def test_a_window_closed_by_the_first_step_has_both_edges(tmp_path):
    """The real calibration with a load that costs a second more at any size and a first step of compute only, 10%
    steeper than the load: the load overtakes start-up, then the first step overtakes the load, so the load is the
    largest only between two sizes."""
    base = ["tiny", "write_gbps=1", "read_gbps=1", "cpus_per_node=2"]
    calibration = fit.load("default")
    f = predict(base, tmp_path)["features"]
    load = calibration["phases"][CROSSOVER_LOAD]["deepspeed/default"]["coefficients"]
    load["cpu"] = load.get("cpu", 0.0) + 1.0  # contention 1: a second
    _, b_load = affine(f, load)
    _, per_compute = affine(f, {"compute": 1.0})
    calibration["phases"]["restart_first_step_seconds"]["deepspeed/cpu"]["coefficients"] = {
        "compute": 1.1 * b_load / per_compute}
    path = tmp_path / "window.json"
    path.write_text(json.dumps(calibration))
    p = predict([*base, f"calibration={path}"], tmp_path)
    c = p["crossover"]
    start, end = by_hand(p["features"], calibration, cx.MIN_BYTES, cx.MAX_BYTES)
    assert start is not None and end < cx.MAX_BYTES, "the case must have a closing edge"
    assert c["status"] == "crosses"
    assert c["crossover_checkpoint_bytes"] == pytest.approx(start, rel=1e-5)
    assert c["load_largest_until_bytes"] == pytest.approx(end, rel=1e-5)
    assert ", until " in cx.headline(c)


def test_none_in_range_is_said(tmp_path):
    base = ["tiny", "write_gbps=1", "read_gbps=1", "cpus_per_node=2"]
    crossing = predict(base, tmp_path)["crossover"]["crossover_checkpoint_bytes"]
    below = predict([*base, f"crossover_max_bytes={crossing // 2}"], tmp_path)["crossover"]
    assert below["status"] == "never_largest" and below["crossover_checkpoint_bytes"] is None
    assert below["largest_at_max"] != CROSSOVER_LOAD
    above = predict([*base, f"crossover_min_bytes={crossing * 2}"], tmp_path)["crossover"]
    assert above["status"] == "already_largest" and above["crossover_checkpoint_bytes"] is None
    assert above["run_load_largest"] is False  # the run's own 3 MiB checkpoint is still below it
    # a fast storage: the CPU's first step grows faster than the load, over the whole default range
    fast = predict(["tiny", "write_gbps=10", "read_gbps=20", "cpus_per_node=2"], tmp_path)["crossover"]
    assert fast["status"] == "never_largest" and fast["largest_at_max"] == "restart_first_step_seconds"
    assert by_hand(predict(["tiny", "write_gbps=10", "read_gbps=20", "cpus_per_node=2"], tmp_path)["features"],
                   fit.load("default"), cx.MIN_BYTES, cx.MAX_BYTES) == (None, None)
    assert cx.headline(fast).startswith("none in 1.00 MiB to 1.00 PiB: the checkpoint load is never the largest")
    # no bandwidth: the load is not predicted, nor is the crossover
    blind = predict(["tiny", "cpus_per_node=2"], tmp_path)["crossover"]
    assert blind["status"] == "not_predicted" and "restart_checkpoint_load_seconds" in blind["why"]


def test_predict_says_it_in_one_line_and_a_short_explanation(tmp_path):
    env = {**os.environ, "RH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([str(REPO / "submit-job.sh"), "predict", "tiny", "write_gbps=1", "read_gbps=1",
                           "cpus_per_node=2"], cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("crossover"))
    assert "checkpoint load largest from" in lines[i] and " GiB (" in lines[i] and "overtaking" in lines[i]
    assert all(line.startswith(" " * 12) for line in lines[i + 1:i + 4])


def test_the_scaled_family_keeps_files_and_scales_bytes_and_parameters(tmp_path):
    f = predict(["tiny", "dp=2", "write_gbps=1", "read_gbps=1", "cpus_per_node=2"], tmp_path)["features"]
    from restart_harness.predict.features import Features

    base = Features(**f)
    big = cx.scaled(base, 10 * base.save_bytes)
    assert big.save_bytes == pytest.approx(10 * base.save_bytes)
    assert big.read_bytes_max_rank == pytest.approx(10 * base.read_bytes_max_rank)
    assert big.parameters_per_rank == pytest.approx(10 * base.parameters_per_rank)
    assert (big.save_files, big.read_files, big.world_size, big.tokens_per_rank_step) == (
        base.save_files, base.read_files, base.world_size, base.tokens_per_rank_step)
    assert math.isclose(cx.scaled(base, base.save_bytes).save_bytes, base.save_bytes)


def refreshed(tmp_path: Path) -> Path:
    """A copy of the stored tiny runs whose summaries carry the prediction as a run of this harness writes it: made
    from each run's own spec and baseline with the default calibration, then set beside what it measured."""
    from restart_harness import resolve
    from restart_harness.predict import forecast
    from restart_harness.results import prediction

    root = tmp_path / "runs"
    shutil.copytree(DATA, root)
    for summary_path in root.rglob("summary.json"):
        run_dir = summary_path.parent
        summary = json.loads(summary_path.read_text())
        run = resolve.read(run_dir)
        made = forecast.build(run, run.facts["host"]["cpus"], forecast.storage(run, record=summary.get("baseline")))
        (run_dir / prediction.FILE).write_text(json.dumps(made))
        summary["prediction"] = prediction.compare(made, summary)
        summary_path.write_text(json.dumps(summary))
    return root


def test_a_summary_sets_the_runs_side_beside_the_prediction(tmp_path):
    for summary_path in refreshed(tmp_path).rglob("summary.json"):
        summary = json.loads(summary_path.read_text())
        c = summary["prediction"]["crossover"]
        m = c["measured"]
        assert m["checkpoint_bytes"] == summary["checkpoint"]["bytes"]
        restart = summary["restart"]
        measured = {"restart_launch_seconds": restart["launch_seconds"],
                    **{f"restart_{k}_seconds": v for k, v in restart["phases"].items()}}
        assert m["largest_phase"] == max(measured, key=measured.get)
        assert m["load_largest"] is False and m["side_agrees"] is (c["run_load_largest"] is False)


def test_the_report_draws_the_crossover_and_the_runs(tmp_path):
    from analysis import load as ld
    from analysis import report

    root = refreshed(tmp_path)
    built = report.build(ld.load([root]).runs, [], [])
    fig = built["figures"]["crossover_seconds"]
    summaries = [json.loads(p.read_text()) for p in root.rglob("summary.json")]
    assert len(fig.axes) == 2  # two families: the stored runs are dp=1 and dp=2
    measured_load = []
    for ax in fig.axes:
        assert ax.get_xscale() == "log" and "GiB" in ax.get_xlabel()
        lines = {line.get_label(): line for line in ax.get_lines()}
        marked = [line for label, line in lines.items() if label.startswith("crossover")]
        crossings = {s["prediction"]["crossover"]["crossover_checkpoint_bytes"] / GIB for s in summaries}
        assert len(marked) == 1 and any(marked[0].get_xdata()[0] == pytest.approx(x) for x in crossings)
        curves = [s["prediction"]["crossover"]["curve"]["seconds"][CROSSOVER_LOAD] for s in summaries]
        assert any(list(lines["checkpoint load"].get_ydata()) == pytest.approx(c) for c in curves)
        measured_load += [tuple(xy) for col in ax.collections if col.get_label() == "measured checkpoint load"
                          for xy in col.get_offsets()]
    expected = [(s["checkpoint"]["bytes"] / GIB, s["restart"]["phases"]["checkpoint_load"]) for s in summaries]
    assert sorted(measured_load) == pytest.approx(sorted(expected))  # every run, at its own checkpoint size
    table = next(t for t in built["tables"] if t.title.startswith("Crossover"))
    assert len(table.rows) == len(built["groups"])
    assert all(row[-1] == "1/1" or row[-1] == "2/2" for row in table.rows)


@pytest.mark.slow
@pytest.mark.spine
def test_a_real_run_records_its_crossover_and_its_side(tiny_dp2):
    """The spine's run (tiny dp=2, launched for real): its summary carries the crossover it predicted before launch
    and its own side of it, measured phase by phase."""
    from restart_harness.results import prediction

    made = json.loads((tiny_dp2 / prediction.FILE).read_text())["crossover"]
    summary = json.loads((tiny_dp2 / "summary.json").read_text())
    c = summary["prediction"]["crossover"]
    assert c["status"] == made["status"] and c["crossover_checkpoint_bytes"] == made["crossover_checkpoint_bytes"]
    assert made["run_checkpoint_bytes"] == pytest.approx(summary["checkpoint"]["bytes"], rel=0.01)  # planned vs on disk
    restart = summary["restart"]
    measured = {"restart_launch_seconds": restart["launch_seconds"],
                **{f"restart_{k}_seconds": v for k, v in restart["phases"].items()}}
    largest = max(measured, key=measured.get)
    assert c["measured"] == {"checkpoint_bytes": summary["checkpoint"]["bytes"], "largest_phase": largest,
                             "load_largest": largest == CROSSOVER_LOAD,
                             "side_agrees": made["run_load_largest"] == (largest == CROSSOVER_LOAD)}
