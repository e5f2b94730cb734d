"""The checkpoint planner: instant, derived from the model's own parameter table and DeepSpeed's own rules (each
rule checked against DeepSpeed's function), and equal to what real runs write and read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cases, load_summary

from restart_harness import resolve
from restart_harness.command import parse_args
from restart_harness.plan import checkpoint, rules
from restart_harness.spec import parameters as table
from restart_harness.spec.runspec import RunSpec

KIB = 1024


def plan_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """./submit-job.sh ... with a temporary results_dir and cache, so nothing real is touched."""
    env = {**os.environ, "RH_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([str(REPO / "submit-job.sh"), *args, f"results_dir={tmp_path / 'results'}"], cwd=tmp_path,
                          check=False, capture_output=True, text=True, timeout=120, env=env)


# ---- the 70B plan ---------------------------------------------------------------------------------------------
def test_70B_tp8_pp4_dp2_plan_is_complete(tmp_path):
    proc = plan_cli(["70B", "tp=8", "pp=4", "dp=2", "plan=json", "bandwidth_gbps=2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    # 83 pipeline layers x 8 TP ranks, 4 stages x 8 TP model files, 64 ranks' optimizer files.
    assert plan["total_files"] == len(plan["files"]) == 83 * 8 + 4 * 8 + 64
    assert plan["by_kind"]["layer_states"]["files"] == 664 and plan["by_kind"]["optimizer_states"]["files"] == 64
    assert {f["rank"] for f in plan["files"]} == set(range(64))
    params = plan["num_parameters"]
    assert params == parse_args(["70B"]).shape.num_parameters()
    # bf16 + ZeRO-1 + Adam: 2 bytes of weights + 12 of fp32 master and moments per parameter; the norms are
    # replicated on all 8 TP ranks (2 per decoder layer + the final one); Adam's step is 4 bytes per rank. No ZeRO
    # padding here: every stage's parameter count is a multiple of 2 x dp.
    norms = (2 * 80 + 1) * 8192
    assert plan["tensor_bytes"] == 14 * (params + 7 * norms) + 4 * 64
    assert plan["total_bytes"] == sum(f["bytes"] for f in plan["files"])
    per = plan["bytes_per_rank"]
    assert per["min"] < per["mean"] < per["max"]
    est = plan["estimate"]
    assert est["save_seconds"] == pytest.approx(plan["total_bytes"] / 2e9, rel=1e-6)
    assert est["restart_read_seconds"] == pytest.approx(plan["restart_read_bytes"] / 2e9, rel=1e-6)
    assert not (tmp_path / "results").exists() and not (tmp_path / "cache").exists()


def _plan_memory(tokens: list[str]) -> tuple[int, int]:
    """(peak bytes Python allocated while building the plan, bytes of the plan as JSON): counted, not timed."""
    import tracemalloc

    from restart_harness.plan import estimate

    spec = parse_args(tokens)
    tracemalloc.start()
    try:
        plan = estimate.build(resolve.plugins(spec), 5.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, len(json.dumps(plan))


def test_plan_memory_grows_no_faster_than_the_plan():
    """How fast the planner answers is a benchmark's figure (benchmarks/planner_and_baseline.py, docs/benchmarks.md);
    what a test can say on a loaded machine is how its work grows: from 64 to 1,024 ranks the memory it needs grows
    no faster than the plan it prints (every file, every rank's reads), so it holds nothing rank-by-rank beyond it."""
    small_peak, small_out = _plan_memory(["70B", "tp=8", "pp=4", "dp=2"])
    large_peak, large_out = _plan_memory(["70B", "tp=8", "pp=4", "dp=32"])
    assert large_out > 4 * small_out
    assert large_peak / small_peak <= large_out / small_out


@pytest.mark.parametrize("tokens", [["small", "dp=2"], ["small", "tp=2", "dp=4"], ["tiny", "dp=4"]])
def test_a_broadcast_load_reads_the_checkpoint_once(tokens):
    """engine=lazy's broadcast load (docs/engines.md): each replicated model file a data-parallel group loads is
    read from storage once by the group (in shares where it is large enough to be written in shares, else by replica
    0); with broadcast_load=false every replica reads it. DeepSpeed has every rank load mp_rank_00 first (to check
    the saved model-parallel size), so at tp > 1 each TP rank's group reads that file too."""
    from restart_harness.plan import estimate

    spec = parse_args(tokens)
    shared = estimate.build(resolve.plugins(parse_args([*tokens, "engine=lazy"])))
    every = estimate.build(resolve.plugins(parse_args([*tokens, "engine=lazy", "broadcast_load=false"])))
    size = {f["path"]: f["bytes"] for f in every["files"]}
    first = size["mp_rank_00_model_states.pt"]
    assert shared["total_bytes"] == every["total_bytes"]
    assert shared["restart_read_bytes"] == shared["total_bytes"] + (spec.tp - 1) * first
    per_group = sum(b for p, b in size.items() if p.startswith("mp_rank_")) + (spec.tp - 1) * first
    assert every["restart_read_bytes"] - shared["restart_read_bytes"] == (spec.dp - 1) * per_group


def test_text_plan_lists_every_file(tmp_path):
    proc = plan_cli(["70B", "tp=8", "pp=4", "dp=2", "plan=true", "bandwidth_gbps=5", "detail=files"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "layer_82-model_07-model_states.pt" in out and "bf16_zero_pp_rank_1_mp_rank_31_optim_states.pt" in out
    assert "total_files        760" in out and "save_seconds" in out and "restart_read_seconds" in out
    assert out.index("total_files") < out.index("layer_82-model_07-model_states.pt")  # the summary first


def test_text_plan_is_a_summary_unless_files_are_asked_for(tmp_path):
    """At scale the file list is thousands of lines: by default the summary alone, durations in readable units."""
    out = plan_cli(["plan", "llama3-1T", "tp=8", "pp=64", "dp=2", "bandwidth_gbps=0.5"], tmp_path).stdout
    assert len(out.splitlines()) < 30 and "total_files" in out and "detail=files" in out, out
    assert "_optim_states.pt" not in out
    save = next(line for line in out.splitlines() if "save_seconds" in line)
    assert " h)" in save, save  # hours said beside the seconds


def test_plan_without_bandwidth_says_how_to_get_one(tmp_path):
    proc = plan_cli(["tiny", "plan=json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "baseline dir=" in json.loads(proc.stdout)["estimate"]["note"]


def test_engine_without_files_plans_nothing(tmp_path):
    plan = json.loads(plan_cli(["tiny", "engine=none", "plan=json"], tmp_path).stdout)
    assert plan["names"] == "none" and plan["total_files"] == 0 and plan["estimate"] is None


@pytest.mark.parametrize("tokens, named", [
    (["70B", "tp=16", "plan=true"], "tp=16"),
    (["tiny", "engine=floppy", "plan=true"], "floppy"),
    (["tiny", "plan=true", "bandwidth_gbps=0"], "bandwidth_gbps=0"),
    (["tiny", "plan=true", "bandwidth_gbps=fast"], "bandwidth_gbps=fast"),
    (["tiny", "plan=maybe"], "plan=maybe"),
    (["tiny", "bandwidth_gbps=2"], "bandwidth_gbps"),
])
def test_plan_bad_input(tokens, named, tmp_path):
    proc = plan_cli(tokens, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr
    assert not (tmp_path / "results").exists()


# ---- one source of truth: the model is built from the parameter table ------------------------------------------
@pytest.mark.parametrize("model, tp", [("tiny", 1), ("tiny", 2), ("70B", 4)])
def test_model_layers_are_built_from_the_table(model, tp):
    import torch

    from restart_harness.model.llama import DecoderLayer, Embedding, FinalNorm, LMHead, TPGroup

    shape = parse_args([model, f"tp={tp}"] + (["shrink=64"] if model == "70B" else [])).shape
    group = TPGroup(None, tp - 1, tp)  # construction needs no communication
    build = {table.EMBEDDING: lambda: Embedding(shape, group, 1),
             table.DECODER: lambda: DecoderLayer(shape, group, 1, 1),
             table.FINAL_NORM: lambda: FinalNorm(shape),
             table.LM_HEAD: lambda: LMHead(shape, group, 1)}
    torch.manual_seed(0)
    for kind in set(table.pipeline_layers(shape)):
        got = [(n, tuple(p.shape)) for n, p in build[kind]().named_parameters()]
        assert got == [(p.name, p.shape) for p in table.layer_params(shape, tp, kind)], kind
    total = sum(p.numel for kind in table.pipeline_layers(shape) for p in table.layer_params(shape, 1, kind))
    assert total == shape.num_parameters()


# ---- DeepSpeed's rules, restated without torch, against DeepSpeed's own functions --------------------------------
def test_partition_rule_is_deepspeeds():
    import random

    from deepspeed.runtime.utils import partition_balanced

    for layers in (1, 2, 3, 4, 5, 7, 16, 28, 32, 40, 80):
        weights = [0] + [1] * layers + [0, 0]
        for pp in range(1, min(layers, 16) + 1):
            assert rules.partition_balanced(weights, pp) == list(partition_balanced(weights, pp)), (layers, pp)
    # on weights of every kind, against DeepSpeed's own
    rng = random.Random(7)
    for _ in range(60):
        weights = [rng.choice((0, 0, 1, 1, 2, 3, 5)) for _ in range(rng.randint(2, 40))]
        pp = rng.randint(1, len(weights) - 1)
        assert rules.partition_balanced(weights, pp) == list(partition_balanced(weights, pp)), (weights, pp)


def test_topology_rank_is_deepspeeds():
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    for pp, tp, dp in ((1, 1, 4), (2, 2, 2), (4, 8, 2), (3, 2, 5)):
        topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        for s in range(pp):
            for d in range(dp):
                for t in range(tp):
                    assert rules.global_rank(s, d, t, dp, tp) == topo.get_rank(pipe=s, data=d, model=t)


def test_zero1_padding_is_deepspeeds():
    import torch
    from deepspeed.runtime.zero.stage_1_and_2 import get_alignment_padding

    for numel in (1, 7, 250432, 10**9 + 3):
        for dp in (1, 2, 3, 8, 64):
            alignment = rules.NCCL_START_ALIGNMENT_FACTOR * dp
            padded = numel + get_alignment_padding([torch.empty(numel, device="meta")], alignment)
            assert rules.zero1_partition_numel(numel, dp) * dp == padded


# ---- against reality: the files real runs wrote and the files their restarts read ------------------------------
# fastpersist: its names (`X.pt-R.N`), model-states replicas and writing ranks come from the engine (Engine.stored)
REAL = cases("tiny-dp2", "tp2-pp2", "70B-tp2-pp4-shrink64", "fastpersist-dp2", "fastpersist-tp2-pp2-dp2",
             "zero2-dp2", "zero3-dp2", "zero3-tp2-dp2")


def _loaded(run_dir: Path) -> dict[int, list[str]]:
    out = {}
    for path in (run_dir / "events" / "restart-01").glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e["event"] == "loaded":
                out[e["rank"]] = sorted({Path(f["path"]).name for f in e["files"]})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_plan_equals_the_real_checkpoint(harness, name):
    run_dir = harness.run(name)
    spec = RunSpec.from_json(json.loads((run_dir / "spec.json").read_text()))  # resolved: the shape as trained
    inventory = json.loads((run_dir / "inventory.json").read_text())
    real = {f["path"]: f for f in inventory["files"]}
    planned = {f.path: f for f in checkpoint.stored_files(spec, resolve.plugins(spec).engine.files())}
    assert sorted(planned) == sorted(real)
    for path, f in planned.items():
        assert (f.kind, f.rank) == (real[path]["kind"], real[path]["rank"]), path
        actual = real[path]["bytes"]
        assert f.tensor_bytes < actual, path  # the exact part is never more than the file
        assert abs(f.bytes - actual) <= max(0.01 * actual, 64 * KIB), (path, f.bytes, actual)
    reads = {r: sorted(paths) for r, paths in checkpoint.stored_reads(spec, resolve.plugins(spec).engine.files()).items()}
    assert reads == _loaded(run_dir)


@pytest.mark.slow
def test_runs_record_baseline_and_efficiency(harness):
    summary = load_summary(harness.run("70B-tp2-pp4-shrink64"))
    base = summary["baseline"]
    for key in ("write_mib_s", "read_mib_s", "method", "file_bytes", "ranks", "dir", "measured_at", "cached"):
        assert key in base, key
    assert base["write_mib_s"] > 0 and base["read_mib_s"] > 0 and base["ranks"] == 8
    eff = summary["checkpoint"]["efficiency"]
    durable = summary["checkpoint"]["throughput_mib_s"]["durable"]
    assert eff["save"] == pytest.approx(durable / base["write_mib_s"], rel=1e-3)
    assert eff["load"] == pytest.approx(summary["restart"]["load_throughput_mib_s"] / base["read_mib_s"], rel=1e-3)
    ceiling = base["ceiling"]  # and against the storage's ceiling, measured with it
    assert eff["save_of_ceiling"] == pytest.approx(durable / ceiling["write_mib_s"], rel=1e-3)
    assert eff["load_of_ceiling"] == pytest.approx(summary["restart"]["load_throughput_mib_s"]
                                                   / ceiling["read_mib_s"], rel=1e-3)
    off = load_summary(harness.run("tp2-pp2"))  # baseline=false
    assert off["baseline"] is None and set(off["checkpoint"]["efficiency"].values()) == {None}
    assert not (harness.run("tp2-pp2") / "baseline.json").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_zero3_partitions_and_sub_groups_are_deepspeeds():
    """The planner's ZeRO-3 rules against DeepSpeed 0.19.8's own code: each parameter padded to a multiple of dp
    (partition_parameters.py _padding_size), and the optimizer's sub-groups (stage3.py _create_fp16_sub_groups, run
    unbound on stand-ins for parameters)."""
    from types import SimpleNamespace

    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.partition_parameters import Init
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    assert DeepSpeedZeroConfig().sub_group_size == rules.ZERO3_SUB_GROUP_SIZE
    for numel in (1, 7, 250432, 10**9 + 3):
        for dp in (1, 2, 3, 8, 64):
            fake = SimpleNamespace(_partition_world_size=lambda p, dp=dp: dp)
            padded = numel + Init._padding_size(fake, SimpleNamespace(ds_numel=numel))
            assert rules.zero3_partition_numel(numel, dp) * dp == padded
    for numels, dp, size in (([10, 20, 30], 2, 100), ([10, 20, 30, 40], 1, 30), ([5] * 7, 3, 4), ([9, 1], 1, 10)):
        params = [SimpleNamespace(partition_numel=lambda n=n, dp=dp: rules.zero3_partition_numel(n, dp))
                  for n in numels]
        groups = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(SimpleNamespace(sub_group_size=size), params)
        expected = [sum(p.partition_numel() for p in g) for g in groups]
        assert rules.zero3_partition_groups(numels, dp, size) == expected, (numels, dp, size)
