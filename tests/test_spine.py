"""The real command for tiny dp=2: summary.json against the files actually on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_summary

from restart_harness.results.summary import RESTART_PHASES

pytestmark = [pytest.mark.slow, pytest.mark.spine]


def _disk_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def test_run_directory_holds_every_artifact(tiny_dp2: Path):
    for name in ("spec.json", "ds_config.json", "launch-checkpoint.sh", "launch-restart-01.sh", "inventory.json",
                 "summary.json", "status.json", "logs/checkpoint.log", "logs/restart-01.log"):
        assert (tiny_dp2 / name).is_file(), name
    for record in ("checkpoint", "restart-01"):
        assert sorted(p.name for p in (tiny_dp2 / "events" / record).iterdir()) == ["rank-00000.jsonl",
                                                                                  "rank-00001.jsonl"]
    spec = json.loads((tiny_dp2 / "spec.json").read_text())
    assert spec["versions"]["torch"] and spec["versions"]["deepspeed"].startswith("0.19")
    assert spec["host"]["cpus"] >= 1 and spec["dp"] == 2
    assert tiny_dp2.name.startswith("tiny-tp1-pp1-dp2-default-")


def test_summary_matches_disk(tiny_dp2: Path):
    summary = load_summary(tiny_dp2)
    inventory = json.loads((tiny_dp2 / "inventory.json").read_text())
    ck = summary["checkpoint"]
    tag_dir = Path(ck["dir"])
    assert tag_dir.is_absolute() and tag_dir.name == "global_step4" == ck["tag"]
    assert (tag_dir.parent / "latest").read_text() == "global_step4"
    files, nbytes = _disk_bytes(tag_dir)
    assert ck["files"] == files == inventory["total_files"] == len(inventory["files"]) == 3
    assert ck["bytes"] == nbytes == inventory["total_bytes"] == sum(f["bytes"] for f in inventory["files"])
    for f in inventory["files"]:
        assert (tag_dir / f["path"]).stat().st_size == f["bytes"]
    kinds = {f["path"]: (f["kind"], f["rank"]) for f in inventory["files"]}
    assert kinds == {
        "mp_rank_00_model_states.pt": ("model_states", 0),
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": ("optimizer_states", 0),
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": ("optimizer_states", 1),
    }


def test_saves_and_throughput(tiny_dp2: Path):
    ck = load_summary(tiny_dp2)["checkpoint"]
    assert [s["tag"] for s in ck["saves"]] == ["global_step2", "global_step4"]
    for save in ck["saves"]:
        assert 0 < save["blocking_seconds"] <= save["durable_seconds"] <= save["commit_seconds"]
        assert save["blocking_seconds"] == max(r["blocking_seconds"] for r in save["per_rank"])
        assert save["throughput_mib_s"]["blocking"] == pytest.approx(
            save["bytes"] / 2**20 / save["blocking_seconds"], rel=1e-3)
        assert sum(r["bytes"] for r in save["per_rank"]) == save["bytes"]  # every file written by a known rank
    assert ck["throughput_mib_s"] == ck["saves"][-1]["throughput_mib_s"]


def test_restart_verified_with_phases_in_order(tiny_dp2: Path):
    summary = load_summary(tiny_dp2)
    restart = summary["restart"]
    assert restart["verified"] is True and restart["differing"] == [] and restart["ranks"] == 2
    assert restart["tag"] == "global_step4"
    assert list(restart["phases"]) == [name for name, _, _ in RESTART_PHASES]
    assert all(v >= 0 for v in restart["phases"].values())
    assert restart["total_seconds"] >= max(restart["phases"].values())
    assert restart["cache"]["observed"] in ("cold", "warm") or restart["cache"]["observed"].startswith("partial")
    assert summary["restarts"] == [restart] and summary["status"]["state"] == "complete"
    # phases from the marks each rank wrote, in order
    for path in (tiny_dp2 / "events" / "restart-01").glob("rank-*.jsonl"):
        marks = [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "mark"]
        names = [m["name"] for m in marks]
        assert names == ["process_start", "imports_done", "dist_init_done", "model_built", "engine_initialized",
                         "checkpoint_loaded", "first_step_done", "finished"]
        assert [m["t"] for m in marks] == sorted(m["t"] for m in marks)


def test_training_continued_from_the_checkpoint(tiny_dp2: Path):
    steps = [json.loads(line) for line in
             (tiny_dp2 / "events" / "restart-01" / "rank-00000.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if e["event"] == "step"] == [5, 6]


def test_the_summary_gives_the_best_checkpoint_interval_at_the_runs_gpus_and_at_scale(tiny_dp2: Path):
    """summary.json `goodput` (docs/goodput.md): from the run's own training lost per save, restart and step, at its
    2 ranks and at at_gpus= (16,384 by default), at Llama 3's published rate."""
    summary = load_summary(tiny_dp2)
    mine, large = summary["goodput"]
    lost = summary["checkpoint"]["training_lost"]
    assert (mine["gpus"], large["gpus"]) == (2, 16_384) and "Llama 3" in mine["mtbf_source"]
    assert mine["save_seconds"] == max(0.0, lost["per_save_seconds_median"])
    assert mine["restart_seconds"] == summary["restart"]["total_seconds"]
    assert mine["job_mtbf_seconds"] == pytest.approx(large["job_mtbf_seconds"] * 16_384 / 2)
    assert 0 < large["goodput_at_best"] < mine["goodput_at_best"] < 1
    assert large["best_interval_seconds"] < mine["best_interval_seconds"]
