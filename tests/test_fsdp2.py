"""stack=fsdp2 (docs/fsdp2.md): the same model and data as the DeepSpeed runs, sharded with FSDP2 and checkpointed by
one collective DCP save per checkpoint; restarted in fresh processes at the saving data-parallel size and at others
(DCP reshards while it loads), every parameter's and optimizer moment's full tensor verified against the digests
taken at save time. Real launches on CPU over gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import copy_run, events, load_summary, restart, run_cli, run_dir_of

pytestmark = pytest.mark.slow
SOURCE = "iters=2 save_interval=2 after=1"


@pytest.fixture(scope="module")
def fsdp2(harness) -> Path:
    """tiny dp=2 stack=fsdp2 (engine dcp by default), restarted at dp=2, then at dp=1 and dp=4."""
    return harness.run("fsdp2-dp2")


def test_checkpoint_is_dcp_s_own_files_one_per_rank(fsdp2):
    spec = json.loads((fsdp2 / "spec.json").read_text())
    assert spec["stack"] == "fsdp2" and spec["engine"] == "dcp" and fsdp2.name.startswith("tiny-tp1-pp1-dp2-fsdp2-dcp")
    inventory = json.loads((fsdp2 / "inventory.json").read_text())
    assert sorted((f["path"], f["kind"], f["rank"]) for f in inventory["files"]) == [
        (".metadata", "dcp_metadata", 0), ("__0_0.distcp", "dcp_shards", 0), ("__1_0.distcp", "dcp_shards", 1)]
    # the shards hold the fp32 parameters and both Adam moments (12 bytes per parameter), and DCP frames every item
    # (each rank's piece of a parameter, of each moment, and the step) as a small torch.save archive of its own
    params = spec["derived"]["num_parameters"]
    digests = json.loads((fsdp2 / "digests" / "global_step2" / "rank-00000.json").read_text())["tensors"]
    items = 2 * 4 * sum(1 for name in digests if name.startswith("model."))
    shards = inventory["by_kind"]["dcp_shards"]["bytes"]
    assert 12 * params < shards < 12 * params + 2048 * items
    sizes = [f["bytes"] for f in inventory["files"] if f["kind"] == "dcp_shards"]
    assert max(sizes) / min(sizes) < 1.1
    # each rank's save record names exactly its own files
    for rank, evs in events(fsdp2).items():
        for save in (e for e in evs if e["event"] == "save"):
            want = {f"__{rank}_0.distcp"} | ({".metadata"} if rank == 0 else set())
            assert {f["path"] for f in save["files"]} == want
            assert 0 < save["blocking_seconds"] <= save["durable_seconds"] <= save["commit_seconds"]
            assert "universal_info" not in save


def test_restarts_at_every_data_parallel_size_restore_the_full_state(fsdp2):
    summary = load_summary(fsdp2)
    assert summary["status"]["state"] == "complete"
    own, one, four = summary["restarts"]
    assert not own.get("layout") or own["layout"]["loaded"] == own["layout"]["saved"]
    for r, ranks, loaded in ((own, 2, None), (one, 1, "tp1-pp1-dp1"), (four, 4, "tp1-pp1-dp4")):
        assert r["verified"] is True and r["differing"] == [] and r["ranks"] == ranks
        assert r["verified_tensors"] == ranks * r["verified_tensors"] // ranks > 0
        assert r["tag"] == "global_step2" and r["first_step"] == 3 and r["conversion"] is None
        if loaded:
            assert r["layout"] == {"saved": "tp1-pp1-dp2", "loaded": loaded}
    # the same global batch from the same state: the same first loss to the bit at every data-parallel size
    assert one["first_step_loss"] == own["first_step_loss"] == four["first_step_loss"]
    # each rank's verification covered the whole state (every parameter, both moments, the steps)
    for record in ("restart-01", "restart-02", "restart-03"):
        checks = [e for evs in events(fsdp2, record).values() for e in evs if e["event"] == "verify"]
        assert len({e["tensors"] for e in checks}) == 1 and all(e["full_state"] for e in checks)
    # no DeepSpeed universal conversion, and the restart's own spec at its layout
    assert not (fsdp2 / "checkpoint" / "global_step2_universal").exists()
    spec = json.loads((fsdp2 / "records" / "spec-restart-03.json").read_text())
    assert spec["dp"] == 4 and spec["micro_batch"] * spec["grad_accum"] * 4 == 8


def test_restart_report_has_the_load_anatomy_and_reads(fsdp2):
    r = load_summary(fsdp2)["restarts"][0]
    b = r["load_breakdown"]
    assert b["read_seconds"] > 0 and b["copy_seconds"] > 0  # DCP's reads, then set_state_dict's copies
    read = {f["path"] for f in b["files"]}
    assert {"global_step2/.metadata", "global_step2/__0_0.distcp", "global_step2/__1_0.distcp"} <= read


def test_restart_at_tensor_or_pipeline_parallel_layouts_is_refused(fsdp2):
    records = sorted(p.name for p in (fsdp2 / "events").iterdir())
    for key in ("tp=2", "pp=2"):
        proc = restart(fsdp2, key)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and key in lines[0] and "stack=fsdp2" in lines[0], proc.stderr
    assert sorted(p.name for p in (fsdp2 / "events").iterdir()) == records


def test_hybrid_sharding_writes_each_shard_once_and_restarts_as_plain_fsdp(fsdp2, tmp_path):
    """replicate=2 at dp=4: two replicas, each sharding the state over 2 ranks (HSDP, as across 2 nodes). DCP saves
    every shard once (replicas' copies deduplicated), and the checkpoint restarts at dp=2 as plain FSDP, verified."""
    run_dir = run_dir_of(run_cli(["tiny", "dp=4", "replicate=2", "stack=fsdp2", *SOURCE.split()], tmp_path))
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] and summary["restart"]["ranks"] == 4
    inventory = json.loads((run_dir / "inventory.json").read_text())
    shards = inventory["by_kind"]["dcp_shards"]
    assert shards["files"] == 4
    # the same state as the dp=2 FSDP run's: each element once, within DCP's per-item framing
    plain = json.loads((fsdp2 / "inventory.json").read_text())["by_kind"]["dcp_shards"]["bytes"]
    assert abs(shards["bytes"] - plain) < 0.05 * plain
    proc = restart(run_dir, "dp=2", "replicate=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = load_summary(run_dir)["restart"]
    assert again["verified"] and again["layout"] == {"saved": "tp1-pp1-dp4", "loaded": "tp1-pp1-dp2"}
    # the same global batch from the same state: the loss of dp=4 HSDP's restart and of dp=2 FSDP's agree
    assert again["first_step_loss"] == pytest.approx(summary["restart"]["first_step_loss"], rel=1e-5)


def test_replicate_that_does_not_fit_is_refused(tmp_path):
    for args, message in ((["dp=4", "replicate=3", "stack=fsdp2"], "replicate=3 does not divide dp=4"),
                          (["dp=2", "replicate=2"], "hybrid sharding is stack=fsdp2's")):
        proc = run_cli(["tiny", *args], tmp_path, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert not any(tmp_path.iterdir())  # nothing created


def test_a_changed_shard_fails_verification(fsdp2, tmp_path):
    fsdp2 = copy_run(fsdp2, tmp_path)
    shard = fsdp2 / "checkpoint" / "global_step2" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # one bit, inside the tensor data (the file is tensors with a small pickle tail)
    shard.write_bytes(bytes(data))
    proc = restart(fsdp2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "did not restore the saved state" in proc.stderr
    last = load_summary(fsdp2)["restarts"][-1]
    assert last["verified"] is False and 1 <= len(last["differing"]) <= 2
