"""Restart at another layout (docs/reshard.md): a checkpoint written at one (tp, pp, dp) is converted once by
DeepSpeed's universal-checkpoint converter and loaded at another, in fresh processes; the full state (every
parameter's fp32 master weights and Adam moments, gathered over TP and ZeRO) is checked against digests taken from
the original files by our own code, and the first loss against a restart at the original layout. The planner's
universal files and per-rank reads are checked against the real ones."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import REPO, copy_run, load_summary, restart, run_cli, run_dir_of

from restart_harness import resolve
from restart_harness.plan import checkpoint, universal
from restart_harness.results import trace
from restart_harness.results.summary import LOSS_CONTINUITY_REL
from restart_harness.spec.runspec import RunSpec

pytestmark = pytest.mark.slow
SOURCE = "iters=2 save_interval=2 after=1"


def listing(run_dir: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(run_dir)), p.stat().st_size) for p in run_dir.rglob("*") if p.is_file())


def spec_of(run_dir: Path) -> RunSpec:
    return RunSpec.from_json(json.loads((run_dir / "spec.json").read_text()))


def at_layout(saved: RunSpec, tp: int, pp: int, dp: int) -> RunSpec:
    return dataclasses.replace(saved, tp=tp, pp=pp, dp=dp, ranks_per_node=None).resolve()


def opened_by_rank(run_dir: Path, record: str, folder: Path) -> dict[int, set[str]]:
    """rank -> the files under folder its processes opened during record (its dftracer trace)."""
    pid_rank = {}
    for path in (run_dir / "events" / record).glob("rank-*.jsonl"):
        for e in map(json.loads, path.read_text().splitlines()):
            if e["event"] == "process":
                pid_rank[e["pid"]] = int(path.stem.split("-")[1])
    opened = defaultdict(set)
    for e in trace.read_events(run_dir / "traces" / record):
        name = e["file"] or ""
        if e["name"] in trace.OPENS and e.get("pid") in pid_rank and name.startswith(f"{folder}/"):
            opened[pid_rank[e["pid"]]].add(name[len(str(folder)) + 1:])
    return opened


@pytest.fixture(scope="module")
def dp2(harness) -> Path:
    """tiny dp=2 (its own restart at dp=2 is the loss reference), then restarted at dp=1 and at tp=2 pp=2 dp=1."""
    return harness.run("reshard-dp2")


def test_restarts_at_other_layouts_restore_the_full_state_and_continue_the_loss(dp2):
    summary = load_summary(dp2)
    own, shrink, split = summary["restarts"]
    assert own["record"] == "restart-01" and own["layout"]["loaded"] == own["layout"]["saved"] and own["verified"]
    for r, loaded in ((shrink, "tp1-pp1-dp1"), (split, "tp2-pp2-dp1")):
        assert r["layout"] == {"saved": "tp1-pp1-dp2", "loaded": loaded}
        assert r["verified"] is True and r["differing"] == [] and r["verified_tensors"] > 0
        assert r["tag"] == "global_step2_universal" and r["first_step"] == 3
        c = r["loss_continuity"]
        assert c["reference_record"] == "restart-01" and c["ok"] and c["rel_diff"] <= LOSS_CONTINUITY_REL
        assert r["load_basis"].startswith("universal")
    # data-parallel changes sum the same global batch: the same loss to the bit
    assert shrink["first_step_loss"] == own["first_step_loss"]
    # the conversion ran once and was reused
    assert shrink["conversion"]["reused"] is False and split["conversion"]["reused"] is True
    convert = json.loads((dp2 / "records" / "convert-global_step2.json").read_text())
    assert convert["converter"] == "deepspeed.checkpoint.ds_to_universal" and convert["seconds"] > 0
    universal_dir = dp2 / "checkpoint" / "global_step2_universal"
    real = [p for p in universal_dir.rglob("*.pt")]
    assert convert["files_written"] == len(real)  # counted before its marker file
    assert convert["bytes_read_counted"] >= convert["input_bytes"]  # it read every original file at least once
    # each restart's own spec and DeepSpeed config, the original ones untouched
    original = json.loads((dp2 / "spec.json").read_text())
    global_batch = original["micro_batch"] * original["grad_accum"] * original["dp"]
    for record, (tp, pp, dp) in (("restart-02", (1, 1, 1)), ("restart-03", (2, 2, 1))):
        spec = json.loads((dp2 / "records" / f"spec-{record}.json").read_text())
        assert (spec["tp"], spec["pp"], spec["dp"]) == (tp, pp, dp)
        assert spec["micro_batch"] * spec["grad_accum"] * dp == global_batch
        assert json.loads((dp2 / "records" / f"ds_config-{record}.json").read_text())["checkpoint"][
            "load_universal"] is True
    assert original["dp"] == 2
    assert "load_universal" not in json.loads((dp2 / "ds_config.json").read_text()).get("checkpoint", {})


def test_planner_predicts_the_universal_files_and_what_each_rank_reads(dp2):
    saved = spec_of(dp2)
    universal_dir = dp2 / "checkpoint" / "global_step2_universal"
    real = {str(p.relative_to(universal_dir)): p.stat().st_size for p in universal_dir.rglob("*.pt")}
    planned = {f.path: f.bytes for f in universal.files(saved)}
    assert set(planned) == set(real)
    assert sum(planned.values()) == pytest.approx(sum(real.values()), rel=0.01)
    assert max(abs(planned[p] - real[p]) for p in real) < 1024
    # what each rank of the tp=2 pp=2 dp=1 restart opened under the universal folder (its dftracer trace)
    opened = opened_by_rank(dp2, "restart-03", universal_dir)
    predicted = universal.restart_read_sequence(saved, at_layout(saved, 2, 2, 1))
    assert set(opened) == set(predicted) == {0, 1, 2, 3}
    for rank, paths in predicted.items():
        assert opened[rank] == set(paths), rank
    # and the counted bytes: every rank read at least the files the planner says it reads in full
    loads = {r["rank"]: r["read_bytes"] for r in load_summary(dp2)["restarts"][2]["load_breakdown"]["per_rank"]}
    for rank, paths in predicted.items():
        assert loads[rank] >= sum(real[p] for p in set(paths) if p in real), rank


def test_plan_command_shows_the_reshard(dp2, tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "plan", "tiny", "dp=2", "to_tp=2", "to_pp=2",
                           "to_dp=1", "plan=json"], check=False, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["reshard"]
    assert plan["from"] == "tp1-pp1-dp2" and plan["to"] == "tp2-pp2-dp1"
    assert plan["total_files"] == len(list((dp2 / "checkpoint" / "global_step2_universal").rglob("*.pt")))


def test_a_zero2_checkpoint_at_tp2_restarts_at_its_own_and_at_another_layout(tmp_path):
    """ZeRO-2 at tp=2 dp=2: the checkpoint is the planner's (names, writers, bytes within its estimate), its own
    restart verifies, and DeepSpeed 0.19.8's converter and universal load take it to tp=1 dp=2 (ZeRO-2 partitions the
    optimizer state as ZeRO-1 does): verified tensor by tensor, the loss continues, the planner names the files."""
    run_dir = run_dir_of(run_cli(["tiny", "tp=2", "dp=2", "zero=2", "baseline=false", *SOURCE.split()], tmp_path))
    saved = spec_of(run_dir)
    written = {f["path"]: f for f in json.loads((run_dir / "inventory.json").read_text())["files"]}
    planned = {f.path: f for f in checkpoint.stored_files(saved, resolve.plugins(saved).engine.files())}
    assert set(written) == set(planned)
    for path, f in planned.items():
        assert written[path]["rank"] == f.rank and abs(written[path]["bytes"] - f.bytes) <= 0.01 * f.bytes, path
    proc = restart(run_dir, "tp=1", "dp=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    own, moved = load_summary(run_dir)["restarts"]
    assert own["verified"] and moved["verified"] and moved["layout"] == {"saved": "tp2-pp1-dp2", "loaded": "tp1-pp1-dp2"}
    assert moved["loss_continuity"]["ok"] and moved["loss_continuity"]["reference_record"] == own["record"]
    universal_dir = run_dir / "checkpoint" / "global_step2_universal"
    assert {f.path for f in universal.files(saved)} == {str(p.relative_to(universal_dir))
                                                        for p in universal_dir.rglob("*.pt")}


def test_a_zero3_checkpoint_restarts_at_another_layout_as_planned(harness, tmp_path):
    """ZeRO-3 at tp=2 dp=2 restarted at tp=1 dp=2: DeepSpeed 0.19.8 converts stage 3's per-parameter partitions and
    loads them with ZeRO-3 at the new layout; the harness's reference, put back together from the original
    partitions by the planner's rules, matches what every rank restored, the loss continues, and the planner names
    the converted files (no step.pt per parameter; optimizer_state.pt keeps the first rank's state whole) and what
    each rank opens (its trace)."""
    run_dir = copy_run(harness.run("zero3-tp2-dp2"), tmp_path)  # the run table's ZeRO-3 run, restarted here again
    proc = restart(run_dir, "tp=1", "dp=2", "trace=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    own, moved = load_summary(run_dir)["restarts"]
    assert moved["verified"] and moved["verified_tensors"] > 0 and moved["tag"] == "global_step2_universal"
    assert moved["loss_continuity"]["ok"] and moved["loss_continuity"]["reference_record"] == own["record"]
    saved = spec_of(run_dir)
    universal_dir = run_dir / "checkpoint" / "global_step2_universal"
    real = {str(p.relative_to(universal_dir)): p.stat().st_size for p in universal_dir.rglob("*.pt")}
    planned = {f.path: f.bytes for f in universal.files(saved)}
    assert set(planned) == set(real) and not any(p.endswith("/step.pt") for p in real)
    assert max(abs(planned[p] - real[p]) for p in real) < 1024
    opened = opened_by_rank(run_dir, "restart-02", universal_dir)
    predicted = universal.restart_read_sequence(saved, at_layout(saved, 1, 1, 2))
    assert set(opened) == set(predicted) == {0, 1}
    for rank, paths in predicted.items():
        assert opened[rank] == set(paths), rank


def test_from_tensor_and_pipeline_parallel_to_data_parallel(harness, tmp_path):
    run_dir = copy_run(harness.run("tp2-pp2"), tmp_path)  # the run table's tp=2 pp=2 run, restarted here again
    proc = restart(run_dir, "tp=1", "pp=1", "dp=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    own, merged = load_summary(run_dir)["restarts"]
    assert merged["layout"] == {"saved": "tp2-pp2-dp1", "loaded": "tp1-pp1-dp2"}
    assert merged["verified"] is True and merged["loss_continuity"]["ok"]
    assert merged["loss_continuity"]["reference_record"] == own["record"]


def test_a_changed_value_in_the_converted_files_fails_verification(dp2, tmp_path):
    """The full-state check is independent of the converter: one changed weight in its output is caught."""
    dp2 = copy_run(dp2, tmp_path)
    universal_dir = dp2 / "checkpoint" / "global_step2_universal"
    target = min(universal_dir.glob("zero/*/fp32.pt"))
    state = torch.load(target, weights_only=False)
    with torch.no_grad():
        state["param"].view(-1)[0] += 1.0
    torch.save(state, target)
    proc = restart(dp2, "dp=1")
    summary = load_summary(dp2)
    last = summary["restarts"][-1]
    assert proc.returncode != 0 and last["verified"] is False
    assert any(target.parent.name in d for d in last["differing"]), last["differing"]


@pytest.mark.parametrize("args, named", [
    (["dp=3"], "dp=3"),
    (["tp=3"], "tp=3"),
    (["pp=9"], "pp=9"),
])
def test_layouts_that_cannot_hold_the_run_are_refused(dp2, args, named):
    before = listing(dp2)
    proc = restart(dp2, *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0] and "accepted" in lines[0], proc.stderr
    assert listing(dp2) == before


@pytest.mark.parametrize("run, named", [("torchsnapshot-dp2", "engine=torchsnapshot"),
                                        ("emulated-tiny-dp2", "emulate")])
def test_checkpoints_that_cannot_be_converted_are_refused(harness, run, named):
    run_dir = harness.run(run)
    before = listing(run_dir)
    proc = restart(run_dir, "dp=1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0] and "accepted" in lines[0], proc.stderr
    assert listing(run_dir) == before


def test_a_restart_at_another_layout_is_labelled_with_its_own_layout_everywhere(harness, tmp_path):
    """The terminal summary, summary.json and the report name the restart's own layout, ranks and what it loaded,
    and the checkpoint the run saved keeps its own name."""
    run_dir, _, (_, split) = harness.played("reshard-dp2")
    rows = {line.split("  ")[0]: line for line in split.stdout.splitlines()}
    assert "tp2-pp2-dp1 (4 ranks), from tp1-pp1-dp2" in rows["restarted at"]
    assert "loaded global_step2_universal:" in rows["restarted at"]
    summary = load_summary(run_dir)
    assert summary["checkpoint"]["tag"] == "global_step2"
    last = summary["restart"]
    assert last["ranks"] == 4 and last["saved_tag"] == "global_step2"
    converted = run_dir / "checkpoint" / "global_step2_universal"
    assert last["loaded"]["tag"] == converted.name
    assert last["loaded"]["files"] == sum(1 for p in converted.rglob("*") if p.is_file())
    proc = subprocess.run([sys.executable, "-m", "analysis", str(run_dir), "-o", str(tmp_path / "r")], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "restart-03 at tp2-pp2-dp1 (4 ranks)" in md  # the slowest-rank table
    assert "tp1 pp1 dp2 -> tp2 pp2 dp1" in md  # the runs table
