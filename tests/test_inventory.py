"""Inventory: kinds by DeepSpeed file name, writers, totals, directory-shard engines."""

from __future__ import annotations

from restart_harness.results.finalize import build_inventory
from restart_harness.schema import classify
from restart_harness.targets.filesystem import FileSystemStored, FileSystemTarget


def test_classify_deepspeed_names():
    assert classify("layer_03-model_01-model_states.pt") == "layer_states"
    assert classify("mp_rank_07_model_states.pt") == "model_states"
    assert classify("zero_pp_rank_1_mp_rank_00_optim_states.pt") == "optimizer_states"
    assert classify("bf16_zero_pp_rank_12_mp_rank_03_optim_states.pt") == "optimizer_states"
    assert classify("mp_rank_00_model_states.pt/0/module/weight_0") == "model_states"  # shard dir
    assert classify("zero_to_fp32.py") == "other"


def test_build_totals_kinds_and_ranks(tmp_path):
    files = {
        "mp_rank_00_model_states.pt": 100,
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 300,
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 300,
        "shards.pt/0/a": 7,
        "shards.pt/0/b": 9,
        "notes.txt": 5,
    }
    tag = tmp_path / "global_step2"
    for rel, size in files.items():
        (tag / rel).parent.mkdir(parents=True, exist_ok=True)
        (tag / rel).write_bytes(b"x" * size)
    writers = {"mp_rank_00_model_states.pt": 0, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 0,
               "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 1, "shards.pt": 1}
    entries = FileSystemStored(FileSystemTarget(None, root=tmp_path)).listing()["global_step2"]  # what the file system stores
    inv = build_inventory(str(tag), writers, entries)
    assert inv["total_files"] == 6 and inv["total_bytes"] == sum(files.values())
    assert inv["total_entries"] == 5  # shards.pt/ is one DeepSpeed file written as a directory
    assert inv["by_kind"]["optimizer_states"] == {"files": 2, "bytes": 600}
    assert inv["by_kind"]["other"] == {"files": 3, "bytes": 21}
    assert inv["by_rank"]["0"] == {"files": 2, "bytes": 400}
    assert inv["by_rank"]["1"] == {"files": 3, "bytes": 316}  # a shard directory inherits its writer
    assert inv["by_rank"]["unknown"] == {"files": 1, "bytes": 5}
