"""`./submit-job.sh mlperf`: MLPerf Storage v2.0's checkpoint workloads through the harness. The table of the four
workloads (sizes from the planner beside MLPerf's stated ones), MLPerf's metrics as its rules define them, and a
scaled-down workload run for real: its checkpoints written, each read cold in fresh processes, verified."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from restart_harness import resolve
from restart_harness.campaigns import mlperf as command
from restart_harness.command import parse
from restart_harness.plan import checkpoint, mlperf
from restart_harness.results import mlperf as metrics
from restart_harness.schema import GIB


def test_the_table_names_every_workload_with_its_exact_deepspeed_size():
    proc = subprocess.run([str(REPO / "submit-job.sh"), "mlperf"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    rows = {r["workload"]: r for r in command.sizes()}
    assert list(rows) == ["llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t"]
    for name, row in rows.items():
        w = mlperf.WORKLOADS[name]
        spec = parse.parse_run([w.preset, *w.layout_tokens])[0]
        assert row["deepspeed_bytes"] == sum(f.bytes for f in checkpoint.stored_files(spec, resolve.plugins(spec).engine.files()))
        assert f"{row['deepspeed_bytes'] / GIB:.2f} GiB" in proc.stdout and name in proc.stdout
    # ZeRO-3 writes no bf16 weights: 12 of the 14 bytes per parameter; ZeRO-1 all 14 (and its framing)
    for name in ("llama3-8b", "llama3-70b"):
        assert rows[name]["deepspeed_bytes"] / rows[name]["parameters"] == pytest.approx(12, rel=0.01)
    for name in ("llama3-405b", "llama3-1t"):
        assert rows[name]["deepspeed_bytes"] / rows[name]["parameters"] == pytest.approx(14, rel=0.001)
    # MLPerf's stated sizes are 14 bytes per parameter in GiB, except the 1T's (docs/planner.md)
    for name in ("llama3-8b", "llama3-70b", "llama3-405b"):
        assert rows[name]["rule_bytes"] / GIB == pytest.approx(rows[name]["stated_bytes"] / 1e9, rel=0.005)


def _summary(per_rank_durable: list[list[float]], load_seconds: list[float], size: int) -> dict:
    saves = [{"tag": f"global_step{i + 1}", "bytes": size, "blocking_seconds": max(d) / 2, "durable_seconds": max(d),
              "commit_seconds": max(d) + 0.1, "per_rank": [{"rank": r, "durable_seconds": s} for r, s in enumerate(d)]}
             for i, d in enumerate(per_rank_durable)]
    restarts = [{"record": f"restart-{i + 1:02d}", "tag": saves[-1]["tag"], "load_seconds": s, "load_bytes": size,
                 "verified": True, "total_seconds": s + 5, "launch_seconds": 2.0, "cache": {"observed": "cold"}}
                for i, s in enumerate(load_seconds)]
    return {"run_id": "r", "status": {"state": "complete"}, "checkpoint": {"saves": saves}, "restarts": restarts}


def test_metrics_follow_mlperfs_rules():
    """Duration: the slowest rank's; throughput: the checkpoint over it (the minimum over ranks); mean over a run's
    checkpoints, then over runs."""
    size = 3 * GIB
    one = metrics.run_metrics(_summary([[1.0, 2.0], [3.0, 1.0]], [0.5, 1.5], size))
    assert [w["duration_seconds"] for w in one["writes"]] == [2.0, 3.0]
    assert one["save_duration_seconds"] == 2.5
    assert one["save_throughput_gib_s"] == pytest.approx((3 / 2 + 3 / 3) / 2)  # mean of throughputs, not 3 / 2.5
    assert one["load_duration_seconds"] == 1.0 and one["load_throughput_gib_s"] == pytest.approx((6 + 2) / 2)
    two = metrics.run_metrics(_summary([[4.0, 4.0]], [2.0], size))
    final = metrics.overall([one, two])
    assert final["runs"] == 2 and final["save_duration_seconds"] == pytest.approx((2.5 + 4.0) / 2)
    assert final["save_duration_seconds_min"] == 2.5 and final["save_duration_seconds_max"] == 4.0
    assert final["load_throughput_gib_s"] == pytest.approx((4.0 + 1.5) / 2)
    # a restart that did not verify is no read
    unverified = _summary([[1.0]], [1.0], size)
    unverified["restarts"][0]["verified"] = False
    assert metrics.run_metrics(unverified)["reads"] == []


@pytest.mark.slow
def test_a_scaled_down_workload_runs_in_subset_mode_with_mlperfs_metrics(tmp_path):
    """llama3-70b shrunk 32x at its real layout (64 ranks, TP 8, ZeRO-3), MLPerf's subset mode: the first host's 8
    ranks write their files of the whole checkpoint twice and read the latest twice, cold, verified; mlperf.json's
    figures are the runs' own; the checkpoints are gone afterwards (keep=false is mlperf's default)."""
    proc = run_cli(["mlperf", "llama3-70b", "subset=true", "shrink=32", "runs=1", "checkpoints=2", "reads=2",
                    "launcher=prefork"],
                   tmp_path, timeout=900)
    folder = Path(proc.stdout.strip().splitlines()[-1])
    record = json.loads((folder / "mlperf.json").read_text())
    assert record["state"] == "complete" and record["scaled_down"] and record["shrink"] == 32
    assert (record["ranks"], record["launched_ranks"], record["subset"], record["zero"]) == (64, 8, True, 3)
    assert (record["checkpoints"], record["reads"]) == (2, 2)
    assert "SCALED DOWN: shrink=32" in proc.stdout and "SUBSET" in proc.stdout
    assert record["workload_parameters"] == 69_882_617_856
    run_dir = Path(record["run_dirs"][0])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["spec"]["nodes"], summary["spec"]["ranks_per_node"]) == (8, 8)
    saves, restarts = summary["checkpoint"]["saves"], summary["restarts"]
    assert [s["tag"] for s in saves] == ["global_step1", "global_step2"]
    assert len(restarts) == 2 and all(r["verified"] and r["cache"]["observed"] == "cold" for r in restarts)
    assert all(r["tag"] == "global_step2" and r["ranks"] == 8 for r in restarts)
    # exactly the first 8 ranks' files of the 64-rank checkpoint: the planner's names, bytes within its estimate
    full = parse.parse_run(["llama3-70B", "tp=8", "dp=8", "zero=3", "shrink=32"])[0]
    planned = {f.path: f.bytes for f in checkpoint.stored_files(full, resolve.plugins(full).engine.files()) if f.rank < 8}
    written = {f["path"]: f["bytes"] for f in json.loads((run_dir / "inventory.json").read_text())["files"]}
    assert sorted(written) == sorted(planned) and len(planned) == 16
    for path, size in written.items():  # storages exact; pickle and zip framing estimated (docs/planner.md)
        assert abs(planned[path] - size) <= 0.002 * size, (path, planned[path], size)
    run = record["per_run"][0]
    for write, save in zip(run["writes"], saves):
        slowest = max(r["durable_seconds"] for r in save["per_rank"])
        assert len(save["per_rank"]) == 8 and save["bytes"] == sum(written.values())
        assert write["duration_seconds"] == pytest.approx(slowest, abs=1e-6)
        assert write["throughput_gib_s"] == pytest.approx(save["bytes"] / GIB / slowest, rel=1e-4)
        assert save["commit_seconds"] >= slowest  # an emulated commit: the slowest rank durable, then `latest`
    assert [r["duration_seconds"] for r in run["reads"]] == [pytest.approx(r["load_seconds"], abs=1e-6)
                                                              for r in restarts]
    assert record["overall"]["save_duration_seconds"] == run["save_duration_seconds"]
    assert not (run_dir / "checkpoint").exists() or not any((run_dir / "checkpoint").iterdir())


@pytest.mark.parametrize("tokens", [["llama3-70B", "tp=8", "dp=8", "zero=3", "nodes=8"],
                                    ["llama3-405B", "tp=8", "pp=32", "dp=2", "nodes=64"],
                                    ["tiny", "tp=2", "pp=2", "dp=2", "nodes=2"], ["tiny", "dp=4", "nodes=4"],
                                    ["tiny", "tp=2", "dp=2", "zero=3", "nodes=2"]])
def test_a_subset_reads_only_files_it_writes(tokens):
    """The first node's ranks read, at a restart, only files they wrote themselves (each rank its own files and
    rank 0's mp_rank_00): subset=true is accepted (the stack checks exactly this) and the planner agrees."""
    spec = parse.parse_run([*tokens, "emulate=true", "subset=true", "shrink=2" if "tiny" not in tokens else
                            "shrink=1"])[0]
    first = range(spec.ranks_per_node)
    written = {r.path for r in checkpoint.recipes(spec) if r.writer in first}
    assert all(set(checkpoint.restart_read_sequence(spec)[rank]) <= written for rank in first)
