"""The layout cases of the run table (conftest.RUNS): expected file names and counts derived from the layout rules
of DeepSpeed / Megatron-DeepSpeed, not from a recorded listing."""

from __future__ import annotations

import json

import pytest
from conftest import RUNS, cases, load_summary

from restart_harness.command import parse_args

pytestmark = pytest.mark.slow

LAYOUTS = cases("dp4", "tp2-dp2", "pp2-dp2", "tp2-pp2", "tp2-pp2-dp2", "70B-tp2-pp4-shrink64")


def expected_files(tp: int, pp: int, dp: int, layers: int, bf16: bool) -> dict[str, tuple[str, int]]:
    """file name -> (kind, writing global rank). Rank = coordinates on DeepSpeed's (pipe, data, model) axes."""
    def rank(stage: int, d: int, t: int) -> int:
        return (stage * dp + d) * tp + t

    prefix = "bf16_" if bf16 else ""
    out = {}
    if pp == 1:
        for t in range(tp):
            out[f"mp_rank_{t:02d}_model_states.pt"] = ("model_states", rank(0, 0, t))
            for d in range(dp):
                out[f"{prefix}zero_pp_rank_{d}_mp_rank_{t:02d}_optim_states.pt"] = ("optimizer_states", rank(0, d, t))
        return out
    # PipelineModule: embedding, the decoder layers, final norm, head; split by decoder layer across stages.
    per_stage = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    first_layer_of = [sum(per_stage[:s]) for s in range(pp)]

    def stage_of(layer_index: int) -> int:
        if layer_index == 0:
            return 0
        if layer_index > layers:
            return pp - 1
        return max(s for s in range(pp) if first_layer_of[s] < layer_index)

    for i in range(layers + 3):
        for t in range(tp):
            out[f"layer_{i:02d}-model_{t:02d}-model_states.pt"] = ("layer_states", rank(stage_of(i), 0, t))
    for s in range(pp):
        for t in range(tp):
            m = s * tp + t
            out[f"mp_rank_{m:02d}_model_states.pt"] = ("model_states", rank(s, 0, t))
            for d in range(dp):
                out[f"{prefix}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt"] = ("optimizer_states", rank(s, d, t))
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_files_match_the_layout_rules(harness, name):
    spec = parse_args(RUNS[name].tokens)
    run_dir = harness.run(name)
    inventory = json.loads((run_dir / "inventory.json").read_text())
    want = expected_files(spec.tp, spec.pp, spec.dp, spec.shape.num_hidden_layers, spec.precision == "bf16")
    got = {f["path"]: (f["kind"], f["rank"]) for f in inventory["files"]}
    assert got == want
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] is True and summary["restart"]["ranks"] == spec.world_size
    by_kind = summary["checkpoint"]["by_kind"]
    for kind in ("layer_states", "model_states", "optimizer_states"):
        assert by_kind[kind]["files"] == sum(1 for k, _ in want.values() if k == kind)
    per_rank = summary["checkpoint"]["bytes_per_rank"]
    ranks = {str(r) for _, r in want.values()}
    writer_bytes = [inventory["by_rank"][r]["bytes"] for r in ranks]
    assert per_rank["max"] == max(writer_bytes) and per_rank["min"] == min(writer_bytes)


def test_shrunk_run_says_so(harness):
    summary = load_summary(harness.run("70B-tp2-pp4-shrink64"))
    assert summary["spec"]["shrink"] == 64 and summary["spec"]["derived"]["shrunk"] is True
    assert summary["spec"]["shape"]["num_hidden_layers"] == 80
    assert summary["run_id"].startswith("70B-shrink64-tp2-pp4-dp1-default-")


@pytest.mark.slow
@pytest.mark.parametrize("name", cases("zero2-dp2", "zero3-dp2"))
def test_zero_to_fp32_reads_the_zero_checkpoint_as_planned(harness, name):
    """DeepSpeed's own zero_to_fp32 consolidates a ZeRO-2 or ZeRO-3 checkpoint into every parameter of the model at
    its full shape, and each value is the ranks' fp32 partitions put back together the way the planner partitions
    them (ZeRO-2: one flat group split in dp parts; ZeRO-3: each parameter split in dp padded parts)."""
    import math
    from pathlib import Path

    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from restart_harness.plan import checkpoint, rules
    from restart_harness.spec.runspec import RunSpec

    run_dir = harness.run(name)
    spec = RunSpec.from_json(json.loads((run_dir / "spec.json").read_text()))
    root = Path(load_summary(run_dir)["checkpoint"]["root"])
    full = get_fp32_state_dict_from_zero_checkpoint(str(root), tag="global_step2")
    (recipe,) = [r for r in checkpoint.recipes(spec) if r.kind == "optimizer_states" and r.dp_rank == 0]
    assert [(n, tuple(t.shape)) for n, t in full.items()] == [(n, tuple(s)) for n, s in recipe.params]

    flats = []
    for d in range(spec.dp):
        state = torch.load(root / "global_step2" / f"bf16_zero_pp_rank_{d}_mp_rank_00_optim_states.pt",
                           map_location="cpu", weights_only=False)["optimizer_state_dict"]
        (flat,) = state["single_partition_of_fp32_groups" if spec.zero == 2 else "fp32_flat_groups"]
        flats.append(flat)
    offset, whole = 0, torch.cat(flats)
    for n, t in full.items():
        numel = math.prod(t.shape)
        if spec.zero == 2:
            expected, offset = whole[offset:offset + numel], offset + numel
        else:
            part = rules.zero3_partition_numel(numel, spec.dp)
            expected, offset = torch.cat([f[offset:offset + part] for f in flats])[:numel], offset + part
        assert torch.equal(t.flatten(), expected), n
