"""The prediction model (docs/prediction.md): its fit recovers known rates, `predict` answers for any layout the
planner takes (1,024 ranks included) and launches nothing, `calibrate` fits finished runs, and every run's summary
sets the prediction made before launch beside what was measured."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, load_summary

from restart_harness.predict import fit
from restart_harness.results import prediction

DATA = REPO / "tests" / "data" / "results"


def cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RH_CACHE_DIR": str(tmp_path / "cache")}  # no cached baseline: the storage is as given
    return subprocess.run([str(REPO / "submit-job.sh"), *args], cwd=tmp_path, check=False, capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_fit_recovers_known_rates_and_keeps_them_non_negative():
    xs = [[1.0, float(n), float(n * n)] for n in range(1, 9)]
    ys = [2.0 + 3.0 * n for n in range(1, 9)]  # no quadratic part
    assert fit.nonnegative_fit(xs, ys) == pytest.approx([2.0, 3.0, 0.0], abs=1e-9)
    falling = [5.0 - 0.5 * n for n in range(1, 9)]  # the best unconstrained slope is negative: dropped
    coef = fit.nonnegative_fit([[1.0, float(n)] for n in range(1, 9)], falling)
    assert coef[1] == 0.0 and coef[0] > 0


def test_predict_answers_every_phase_from_the_calibration_and_launches_nothing(tmp_path):
    proc = cli(["predict", "tiny", "dp=2", "write_gbps=1", "read_gbps=2", "cpus_per_node=2", "predict=json",
                f"results_dir={tmp_path / 'results'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert set(p["phases"]) == set(prediction.PHASES)
    calibration = fit.load("default")
    for name, row in p["phases"].items():
        assert row["seconds"] is not None and row["low"] <= row["seconds"] <= row["high"], name
    restart = [p["phases"][n]["seconds"] for n in prediction.RESTART_PHASES]
    assert p["phases"][prediction.TOTAL]["seconds"] == pytest.approx(sum(restart), abs=1e-5)
    # each term is its fitted rate times the run's feature: the load's storage term is bytes / bandwidth
    load = p["phases"]["restart_checkpoint_load_seconds"]
    rate = calibration["phases"]["restart_checkpoint_load_seconds"]["deepspeed/default"]["coefficients"]
    if "storage_read" in rate:
        assert load["terms_seconds"]["storage_read"] == pytest.approx(
            rate["storage_read"] * p["features"]["read_bytes"] / 2e9, abs=2e-6)
    assert p["features"]["world_size"] == 2 and p["features"]["contention"] == 1.0
    assert not (tmp_path / "results").exists() and not (tmp_path / "cache").exists()


def test_predict_at_1024_ranks_names_what_it_extrapolates(tmp_path):
    proc = cli(["predict", "llama3-405B", "tp=8", "pp=16", "dp=8", "nodes=128", "launcher=slurm", "write_gbps=100",
                "read_gbps=200", "cpus_per_node=64", "predict=json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    f = p["features"]
    assert (f["world_size"], f["nodes"], f["ranks_per_node"]) == (1024, 128, 8)
    assert f["save_bytes"] > 5 * 10**12  # 405B x 14 bytes
    assert any("extrapolated" in n for n in p["note"]) and any("slurm" in n for n in p["note"])
    assert p["phases"]["restart_total_with_launch_seconds"]["seconds"] > 0
    text = cli(["predict", "llama3-405B", "tp=8", "pp=16", "dp=8", "nodes=128", "launcher=slurm",
                "write_gbps=100", "read_gbps=200", "cpus_per_node=64"], tmp_path)
    assert "(extrapolated)" in text.stdout and "storage bandwidth" in text.stdout


def test_without_a_bandwidth_the_phases_moving_bytes_say_why(tmp_path):
    proc = cli(["predict", "tiny", "predict=json", f"results_dir={tmp_path}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert p["storage"].startswith("none")
    needing = [n for n, g in fit.load("default")["phases"].items()
               if any(t in g.get("deepspeed/default", {}).get("coefficients", {}) for t in ("storage_write",
                                                                                             "storage_read"))]
    for name in needing:
        assert p["phases"][name]["seconds"] is None and "bandwidth" in p["phases"][name]["why"]


def test_calibrate_fits_finished_runs_and_predict_uses_the_file(tmp_path):
    out = tmp_path / "cal" / "mine.json"
    proc = cli(["calibrate", f"runs={DATA}", f"out={out}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    cal = json.loads(out.read_text())
    assert len(cal["runs"]) == len(fit.run_dirs([DATA])) == 3
    launch = cal["phases"]["restart_launch_seconds"]["local"]
    assert launch["runs"] == 3 and launch["coefficients"]
    assert "restart_launch_seconds" in proc.stdout
    p = json.loads(cli(["predict", "tiny", f"calibration={out}", "write_gbps=1", "read_gbps=1", "predict=json"],
                       tmp_path).stdout)
    assert p["calibration"]["path"] == str(out) and p["calibration"]["runs"] == 3
    # the calibration names the devices its runs computed on (runs before 2026-11-26: the kind, not the model)
    assert cal["devices"] == [{"kind": "cpu", "model": None, "count": 2}] and p["other_device"] is False
    # the fit reproduces its own runs within the range it states
    for run_dir in fit.run_dirs([DATA]):
        o = fit.observation(run_dir)
        assert o["measured"]["restart_total_with_launch_seconds"] == pytest.approx(
            load_summary(run_dir)["restart"]["launch_seconds"] + load_summary(run_dir)["restart"]["total_seconds"])


def test_a_half_written_summary_among_the_runs_is_skipped_not_a_traceback(tmp_path):
    """A run folder whose summary.json is torn (a run killed while writing it, a foreign file) is skipped with why;
    with no run of the named device left, the refusal is the usual one line."""
    torn = tmp_path / "runs" / "torn"
    torn.mkdir(parents=True)
    (torn / "summary.json").write_text('{"status": {"state": "comp')
    (torn / "spec.json").write_text("")
    proc = cli(["calibrate", f"runs={tmp_path / 'runs'}", "device=cuda", "out=x.json"], tmp_path)
    assert proc.returncode == 2 and "none of its 1 runs" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists(), proc.stderr


@pytest.mark.parametrize("args, named", [
    (["calibrate", "out=x.json"], "runs="),
    (["calibrate", "runs=/nonexistent", "out=x.json"], "runs=/nonexistent"),
    (["calibrate", "runs=.", "out=x.json", "tp=2"], "tp=2"),
    # a calibration folder that holds no runs of the named device (these are CPU runs)
    (["calibrate", f"runs={DATA}", "device=cuda", "out=x.json"], "none of its 3 runs computed on device=cuda"),
    (["calibrate", f"runs={DATA}", "base=nosuch", "out=x.json"], "base=nosuch"),
])
def test_calibrate_refuses_bad_input_in_one_line(args, named, tmp_path):
    proc = cli(args, tmp_path)
    assert proc.returncode == 2 and named in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_every_run_carries_its_prediction_beside_what_it_measured(tiny_dp2):
    made = json.loads((tiny_dp2 / prediction.FILE).read_text())
    assert made["calibration"]["name"] == "default" and made["features"]["world_size"] == 2
    summary = load_summary(tiny_dp2)
    checked = summary["prediction"]
    restart = summary["restart"]
    phases = checked["phases"]
    assert phases["restart_total_with_launch_seconds"]["measured"] == pytest.approx(
        restart["launch_seconds"] + restart["total_seconds"], abs=1e-6)
    assert phases["restart_engine_init_seconds"]["measured"] == pytest.approx(restart["phases"]["engine_init"])
    durable = [s["durable_seconds"] for s in summary["checkpoint"]["saves"]]
    assert phases["save_durable_seconds"]["measured"] == pytest.approx(statistics.median(durable), abs=1e-6)
    for name, row in phases.items():
        assert row["predicted"] == made["phases"][name]["seconds"], name
        if row["predicted"] is not None and row["measured"] and not row.get("not_comparable"):
            assert row["rel_error"] == pytest.approx((row["predicted"] - row["measured"]) / row["measured"],
                                                     abs=1e-3)
            assert row["within_range"] == (row["low"] <= row["measured"] <= row["high"])


def test_a_stated_metadata_rate_costs_each_file_one_operation(tmp_path):
    base = ["predict", "70B", "tp=8", "pp=4", "dp=2", "nodes=8", "device=cuda", "cpus_per_node=64",
            "write_gbps=50", "read_gbps=100", "predict=json"]
    plain = json.loads(cli(base, tmp_path).stdout)
    limited = json.loads(cli([*base, "metadata_ops_s=500"], tmp_path).stdout)
    f = limited["features"]
    assert f["save_files"] == 760 and f["read_files"] > f["save_files"]  # every rank opens the shared model files
    for phase, files in (("save_durable_seconds", f["save_files"]), ("restart_checkpoint_load_seconds",
                                                                      f["read_files"])):
        assert limited["phases"][phase]["seconds"] - plain["phases"][phase]["seconds"] == pytest.approx(
            files / 500, abs=1e-5)
    assert "metadata_ops_s=500" in limited["storage"]


def test_an_environments_metadata_rate_prices_the_import_storm(tmp_path):
    """1,024 nodes x 4 ranks on a file system answering 100,000 metadata operations a second: imports and engine
    set-up each carry every rank's measured operations (configs/restart_io.json) over that rate, named."""
    from restart_harness.predict import restart_io

    phases, key = restart_io.lookup("deepspeed", "default", "default")
    assert key == "deepspeed/default" and phases["imports"]["metadata_ops"] > 10_000, phases
    base = ["predict", "70B", "tp=4", "pp=8", "dp=128", "nodes=1024", "launcher=slurm", "device=cpu",
            "cpus_per_node=64", "write_gbps=100", "read_gbps=200", "predict=json"]
    plain = json.loads(cli(base, tmp_path).stdout)
    storm = json.loads(cli([*base, "env_metadata_ops_s=100000"], tmp_path).stdout)
    assert storm["features"]["world_size"] == 4096
    for phase, name in (("restart_imports_seconds", "imports"), ("restart_model_build_seconds", "model_build"),
                        ("restart_engine_init_seconds", "engine_init")):
        expected = 4096 * phases[name]["metadata_ops"] / 100_000
        assert storm["phases"][phase]["terms_seconds"]["environment_metadata"] == pytest.approx(expected, rel=1e-4)
        assert storm["phases"][phase]["seconds"] - plain["phases"][phase]["seconds"] == pytest.approx(expected,
                                                                                                       abs=1e-4)
        assert plain["phases"][phase]["terms_seconds"].get("environment_metadata", 0.0) == 0.0
    assert storm["phases"]["restart_imports_seconds"]["bound"].startswith("the environment's file system")
    assert any("operations/s if every rank starts at once" in n for n in storm["note"])
    assert any("give env_metadata_ops_s=" in n for n in plain["note"])
    text = cli([*base[:-1], "env_metadata_ops_s=100000"], tmp_path).stdout
    assert "an import storm" in text


def test_a_prediction_for_another_device_says_so_beside_every_figure(tmp_path):
    """A calibration is tied to the device its runs computed on: predicting a GPU run with this project's CPU
    calibration says so in its header and beside every figure (prediction.json: other_device), never quietly."""
    gpu = cli(["predict", "small", "device=cuda", "write_gbps=1", "read_gbps=1"], tmp_path)
    assert gpu.returncode == 0, gpu.stderr
    assert "NOT THIS RUN'S DEVICE" in gpu.stdout and "save_durable_seconds" in gpu.stdout
    figures = [line for line in gpu.stdout.splitlines()
               if line.startswith(("save_", "restart_")) and "not predicted" not in line]
    assert figures and all("[ANOTHER DEVICE's rates]" in line for line in figures), gpu.stdout
    made = json.loads(cli(["predict", "small", "device=cuda", "write_gbps=1", "read_gbps=1", "predict=json"],
                          tmp_path).stdout)
    assert made["other_device"] is True and made["device"]["kind"] == "cuda"
    assert made["note"][0].startswith("calibrated on another device (cpu: ")
    cpu = json.loads(cli(["predict", "small", "write_gbps=1", "read_gbps=1", "predict=json"], tmp_path).stdout)
    assert cpu["other_device"] is False and cpu["device"]["kind"] == "cpu"


def _gpu_cluster_runs(dest: Path) -> Path:
    """The fixture runs as a GPU cluster's run folders brought here: their spec.json says cuda and the GPUs."""
    for run_dir in fit.run_dirs([DATA]):
        copy = dest / run_dir.name
        shutil.copytree(run_dir, copy)
        spec = json.loads((copy / "spec.json").read_text())
        spec["device"] = "cuda"
        spec["host"].update(gpu_model="NVIDIA H100 80GB HBM3", gpus=8)
        (copy / "spec.json").write_text(json.dumps(spec))
    return dest


def test_start_up_on_a_device_the_calibration_lacks_is_not_predicted_until_its_runs_are_brought_in(tmp_path):
    """A CPU calibration predicts no GPU start-up (never this machine's ranks relabelled as GPUs); a GPU cluster's
    run folders, calibrated with device=cuda (onto the default's groups with base=), then predict it."""
    startup = [n for n in prediction.RESTART_PHASES if n != "restart_checkpoint_load_seconds"]
    args = ["predict", "small", "dp=8", "device=cuda", "write_gbps=1", "read_gbps=1", "predict=json"]
    cpu_only = json.loads(cli(args, tmp_path).stdout)
    for name in [*startup, prediction.TOTAL]:
        assert cpu_only["phases"][name]["seconds"] is None and "no run on cuda" in cpu_only["phases"][name]["why"]
    assert cpu_only["phases"]["save_durable_seconds"]["seconds"] is not None  # the storage's part, other device
    out = tmp_path / "cluster.json"
    proc = cli(["calibrate", f"runs={_gpu_cluster_runs(tmp_path / 'from-cluster')}", "device=cuda", "base=default",
                f"out={out}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    cal = json.loads(out.read_text())
    assert {d["kind"] for d in cal["devices"]} == {"cpu", "cuda"}
    engine_init = cal["phases"]["restart_engine_init_seconds"]
    assert engine_init["deepspeed/cpu"] == fit.load("default")["phases"]["restart_engine_init_seconds"]["deepspeed/cpu"]
    assert engine_init["deepspeed/cuda"]["runs"] == 3
    gpu = json.loads(cli([*args, f"calibration={out}"], tmp_path).stdout)
    for name in [*startup, prediction.TOTAL]:
        assert gpu["phases"][name]["seconds"] is not None, (name, gpu["phases"][name])


def test_an_engine_without_its_own_calibration_says_whose_rates_in_each_figure(tmp_path):
    out = tmp_path / "default-only.json"
    assert cli(["calibrate", f"runs={DATA}", f"out={out}"], tmp_path).returncode == 0
    base = ["predict", "tiny", "engine=lazy", f"calibration={out}", "write_gbps=1", "read_gbps=1"]
    made = json.loads(cli([*base, "predict=json"], tmp_path).stdout)
    for name in ("save_durable_seconds", "restart_checkpoint_load_seconds"):
        assert made["phases"][name]["borrowed"] == ("deepspeed/default's rates: deepspeed/lazy has no run in the "
                                                   "calibration"), made["phases"][name]
    assert "deepspeed/default" in made["phases"][prediction.TOTAL]["borrowed"]
    assert "borrowed" not in made["phases"]["restart_imports_seconds"]  # per stack: lazy's own runs' stack
    text = cli(base, tmp_path).stdout
    durable = next(line for line in text.splitlines() if line.startswith("save_durable_seconds"))
    assert "[BORROWED: deepspeed/default's rates" in durable


@pytest.mark.slow
def test_a_check_is_compared_only_under_its_calibrations_conditions(tiny_dp2):
    """Every launch records other work's share of the CPUs while it ran; a phase measured under a load its
    calibration's runs did not have is not compared, and says why."""
    summary = load_summary(tiny_dp2)
    during = summary["checkpoint"]["machine_load"]["during"]
    assert 0.0 <= during["other_cpu_fraction"] <= 1.0 and during["seconds"] > 0
    made = json.loads((tiny_dp2 / prediction.FILE).read_text())
    load = prediction.other_work(summary["checkpoint"])
    for span, compared in (([load, load], True), ([load + 0.5, load + 0.6], False)):
        made["phases"]["save_durable_seconds"]["calibrated_conditions"] = {"contention": [1, 1],
                                                                           "other_cpu_fraction": span}
        row = prediction.compare(made, summary)["phases"]["save_durable_seconds"]
        assert (row["rel_error"] is not None) is compared, row
        assert compared or row["not_comparable"].startswith(f"other work used {load:.0%} of the CPUs"), row


def test_an_emulation_in_waves_is_predicted_one_wave_at_a_time(tmp_path):
    """tiny dp=4 with a budget for one rank's file state works one rank at a time (tests/test_emulate.py): a rank's
    save and load are its own wave's, so the storage and the cores are shared by the ranks of a wave, not the node's."""
    base = ["predict", "tiny", "dp=4", "emulate=true", "write_gbps=1", "read_gbps=1", "predict=json"]
    whole = json.loads(cli(base, tmp_path).stdout)
    waves = json.loads(cli([*base, "emulate_memory_gib=0.0015"], tmp_path).stdout)
    f, g = waves["features"], whole["features"]
    assert (g["io_ranks_per_node"], f["io_ranks_per_node"]) == (4, 1)
    assert g["save_bytes_at_once"] == g["save_bytes"] and g["read_bytes_at_once"] == g["read_bytes"]
    assert f["save_bytes_at_once"] == f["save_bytes_max_rank"] < f["save_bytes"]
    assert f["read_bytes_at_once"] == f["read_bytes_max_rank"] < f["read_bytes"]
    for phase, term, at_once in (("save_durable_seconds", "storage_write", "save_bytes_at_once"),
                                 ("restart_checkpoint_load_seconds", "storage_read", "read_bytes_at_once")):
        assert waves["phases"][phase]["terms_seconds"][term] == pytest.approx(f[at_once] / 1e9, abs=1e-6)
        assert waves["phases"][phase]["seconds"] < whole["phases"][phase]["seconds"]


def test_ranks_still_saving_share_the_cores_and_the_last_works_on_alone(tmp_path):
    """tiny dp=8 ZeRO-1 on 2 cores: rank 0 writes the model file and its optimizer shard (B bytes), the seven others a
    shard each (b). The eight share the cores at a quarter of one each until the seven finish (4b), and rank 0 writes
    its last B - b alone at one core's pace: B + 3b, not the busiest rank's bytes times four."""
    p = json.loads(cli(["predict", "tiny", "dp=8", "cpus_per_node=2", "write_gbps=1", "read_gbps=1",
                        "predict=json"], tmp_path).stdout)
    f = p["features"]
    big, small = f["save_bytes_max_rank"], (f["save_bytes"] - f["save_bytes_max_rank"]) / 7
    assert big > 2 * small and f["contention"] == 4
    assert f["save_core_bytes"] == pytest.approx(big + 3 * small)
    assert big < f["save_core_bytes"] < big * f["contention"]
