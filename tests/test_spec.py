"""Arguments -> RunSpec -> ds_config: parsing, layout validation, presets, shrink. No launches."""

from __future__ import annotations

import json
import os
import time

import pytest

from restart_harness import resolve
from restart_harness.command import parse_args
from restart_harness.errors import UsageError
from restart_harness.rundir.create import build_ds_config
from restart_harness.rundir.scripts import launch_script, worker_args
from restart_harness.spec.model_shape import load_model, preset_names


def test_defaults_for_tiny():
    spec = parse_args(["tiny"])
    assert (spec.tp, spec.pp, spec.dp, spec.world_size) == (1, 1, 1, 1)
    assert spec.engine == "default" and spec.precision == "bf16"
    assert spec.seq_len == 64  # min(max_position_embeddings=64, 2048)


def test_overrides_are_typed():
    spec = parse_args(["tiny", "dp=2", "iters=6", "save_interval=3", "lr=3e-4", "precision=fp32", "vocab_size=1024"])
    assert spec.dp == 2 and spec.iters == 6 and spec.lr == pytest.approx(3e-4)
    assert spec.precision == "fp32" and spec.shape.vocab_size == 1024


def test_dp_derived_from_ranks():
    spec = parse_args(["tiny", "tp=2", "ranks_per_node=8"])
    assert spec.dp == 4 and spec.world_size == 8


@pytest.mark.parametrize("preset", ["1B", "3B", "7B", "13B", "70B"])
def test_real_presets_have_published_parameter_counts(preset):
    shape, _ = load_model(preset)
    # Published sizes (untied head): 1.24B (tied in HF; +0.26B untied), 3.2B (+0.39B), 7.24B, 13.0B, 70.6B.
    expected = {"1B": 1.50e9, "3B": 3.61e9, "7B": 7.24e9, "13B": 13.0e9, "70B": 70.6e9}[preset]
    assert shape.num_parameters() == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("preset, stated_gib", [("llama3-8B", 105), ("llama3-70B", 912), ("llama3-405B", 5290)])
def test_mlperf_presets_give_mlperfs_stated_checkpoint_sizes(preset, stated_gib):
    """MLPerf Storage v2.0 states its workloads' checkpoint sizes (105 GB, 912 GB, 5.29 TB): they are 14 bytes per
    parameter (bf16 weights, fp32 master weights, two fp32 Adam moments) of these shapes, in GiB. The 70B workload's
    128 heads of 64 make it smaller than Llama 3 70B (64 heads of 128: wider key/value projections)."""
    shape, _ = load_model(preset)
    assert shape.num_parameters() * 14 / 2**30 == pytest.approx(stated_gib, rel=0.005)
    assert preset in preset_names()


def test_presets_listed():
    assert {"tiny", "small", "1B", "3B", "7B", "13B", "70B"} <= set(preset_names())


def test_shrink_keeps_layers_and_heads():
    spec = parse_args(["70B", "tp=2", "pp=4", "shrink=64"])
    s = spec.shape
    assert (s.num_hidden_layers, s.num_attention_heads, s.num_key_value_heads) == (80, 64, 8)
    assert (s.dim_per_head, s.intermediate_size, s.vocab_size) == (2, 448, 2004)
    assert spec.world_size == 8 and spec.model_label == "70B-shrink64"
    assert spec.seq_len == 32


def test_hf_config_json(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
           "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = parse_args([str(tmp_path), "tp=2"])
    assert spec.shape.hidden_size == 256 and spec.shape.num_key_value_heads == 2
    assert spec.model_source.endswith("config.json")


@pytest.mark.parametrize("tokens, fragment", [
    (["nosuch"], "unknown model 'nosuch'"),
    (["tiny", "dp"], "malformed argument"),
    (["tiny", "colour=red"], "unknown key 'colour'"),
    (["tiny", "iters=four"], "iters=four: not an integer"),
    (["tiny", "lr=fast"], "lr=fast: not a number"),
    (["tiny", "tp=0"], "tp=0: must be a positive integer"),
    (["tiny", "precision=fp8"], "precision=fp8: accepted values are bf16, fp32"),
    (["7B", "tp=3"], "tp=3 does not divide num_attention_heads=32"),
    (["13B", "tp=16"], "tp=16 does not divide num_attention_heads=40"),
    (["70B", "tp=16"], "tp=16 does not divide num_key_value_heads=8"),
    (["tiny", "pp=5"], "pp=5 is larger than the 4 transformer layers"),
    (["tiny", "dp=2", "ranks_per_node=3"], "dp=2 does not match the ranks"),
    (["tiny", "save_interval=5", "iters=4"], "save_interval=5 is larger than iters=4"),
    (["tiny", "iters=-1"], "iters=-1: must be a positive integer"),
    (["tiny", "dp=2;touch X"], "dp=2;touch X: not an integer"),
    (["tiny", "engine=nosuch"], "engine=nosuch: unknown engine"),
    (["tiny", "lr=nan"], "lr=nan: must be a finite number"),
    (["tiny", "walltime=90min"], "walltime=90min"),
    (["tiny", "hidden_size=0"], "hidden_size=0: must be a positive integer"),
    (["tiny", "seq_len=4096"], "seq_len=4096 exceeds max_position_embeddings=64"),
    (["tiny", "dp=1", "dp=2"], "given twice"),
    (["70B", "shrink=128"], "shrink=128: head dimension 128/128 = 1"),
])
def test_bad_input_is_one_clear_line(tokens, fragment):
    with pytest.raises(UsageError) as info:
        parse_args(tokens)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_unsafe_yaml_preset_is_refused(tmp_path):
    bad = tmp_path / "evil.yaml"
    bad.write_text("hidden_size: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(UsageError, match="not safe YAML"):
        parse_args([str(bad)])
    assert not (tmp_path / "pwned").exists()


def test_ds_config_zero1_adamw_batch():
    spec = parse_args(["tiny", "dp=2", "micro_batch=3", "grad_accum=2"])
    cfg = build_ds_config(resolve.plugins(spec))
    assert cfg["zero_optimization"] == {"stage": 1}
    assert cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["torch_adam"] is True
    assert cfg["train_batch_size"] == 3 * 2 * 2
    assert cfg["train_micro_batch_size_per_gpu"] == 3 and cfg["gradient_accumulation_steps"] == 2
    assert cfg["bf16"]["enabled"] is True
    assert build_ds_config(resolve.plugins(parse_args(["tiny", "precision=fp32"])))["bf16"]["enabled"] is False


def test_launch_script_uses_deepspeed_launcher(tmp_path):
    spec = parse_args(["tiny", "dp=2", "device=cpu"])
    plugins = resolve.plugins(spec)
    cmd = plugins.launcher.launch(29555, worker_args(tmp_path, "checkpoint", "checkpoint"))
    text = launch_script(plugins, "checkpoint", cmd)
    assert "deepspeed.launcher.runner" in text and "--num_gpus 2" in text and "--master_port 29555" in text
    assert "export DS_ACCELERATOR=cpu" in text and "export OMP_NUM_THREADS=1" in text
    assert "TORCH_EXTENSIONS_DIR=" in text and "--module restart_harness.worker" in text


def test_jit_ops_are_cached_per_python_environment(tmp_path, monkeypatch):
    """Two environments never share a JIT build folder (each would rebuild the other's ops, whose build flags name
    its paths); the ranks get this environment's, and the stale-lock sweep looks there."""
    from restart_harness.files import cache_dir as cache

    monkeypatch.setenv(cache.ENV, str(tmp_path))
    mine = cache.extensions_dir()
    assert mine.parent == tmp_path / "torch_extensions"
    spec = parse_args(["tiny", "dp=2", "device=cpu"])
    plugins = resolve.plugins(spec)
    text = launch_script(plugins, "checkpoint", plugins.launcher.launch(29555, worker_args(tmp_path, "c", "c")))
    assert f"TORCH_EXTENSIONS_DIR={mine}" in text
    monkeypatch.setattr(cache.sys, "prefix", str(tmp_path / "another-venv"))
    assert cache.extensions_dir() != mine and cache.extensions_dir().parent == mine.parent


def test_run_directories_never_collide(tmp_path):
    from restart_harness.rundir.create import new_run_dir

    spec = parse_args(["tiny", f"results_dir={tmp_path}"])
    dirs = {new_run_dir(resolve.plugins(spec)) for _ in range(3)}  # same second, same spec
    assert len(dirs) == 3 and all(d.is_dir() for d in dirs)


# ---- third_party/torch_extension_lock --------------------------------------------------------------------------
def test_stale_extension_lock_is_removed_and_a_held_or_young_one_kept(tmp_path):
    from third_party.torch_extension_lock import STALE_SECONDS, remove_stale

    stale, held, young = (tmp_path / name / "lock" for name in ("stale_op", "held_op", "young_op"))
    for lock in (stale, held, young):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - STALE_SECONDS - 60
    for lock in (stale, held):
        os.utime(lock, (old, old))
    fd = os.open(held, os.O_RDONLY)  # a build in progress keeps its lock open
    try:
        assert remove_stale(tmp_path) == [stale]
    finally:
        os.close(fd)
    assert not stale.exists() and held.exists() and young.exists()


def test_a_lock_made_during_a_launch_and_held_by_nothing_is_removed_once_it_is_gone(tmp_path):
    from third_party.torch_extension_lock import remove_orphaned

    start = time.time()
    before, orphaned, held = (tmp_path / name / "lock" for name in ("before_op", "orphaned_op", "held_op"))
    for lock in (before, orphaned, held):
        lock.parent.mkdir()
        lock.touch()
    os.utime(before, (start - 60, start - 60))  # another run's, older than this launch
    fd = os.open(held, os.O_RDONLY)  # a concurrent run's build in progress
    try:
        assert remove_orphaned(tmp_path, start) == [orphaned]
    finally:
        os.close(fd)
    assert before.exists() and held.exists()


def test_torch_file_baton_still_waits_on_an_ownerless_lock(tmp_path):
    """The reason for third_party/torch_extension_lock: torch's baton waits on a lock whose builder is gone. When this
    fails, torch recovers by itself and the shim can go."""
    import threading

    from torch.utils.file_baton import FileBaton

    lock = tmp_path / "lock"
    lock.touch()  # left behind by a killed build: no process holds it
    waiter = threading.Thread(target=FileBaton(str(lock), wait_seconds=0.05).wait, daemon=True)
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive()
    lock.unlink()  # let the thread end
    waiter.join(timeout=1.0)


@pytest.mark.parametrize("args, label", [
    (["tiny", "engine=fastpersist"], "fastpersist"),  # io_buffer_double is on by default: not a difference
    (["tiny", "engine=fastpersist", "io_buffer_double=false"], "fastpersist no_io_buffer_double"),
    (["tiny", "engine=dcp", "async_save=true"], "dcp async_save"),
    (["tiny", "engine=dcp"], "dcp"),
])
def test_engine_label_names_the_options_a_run_changed(args, label):
    from restart_harness.schema import engine_label

    spec = parse_args(args).to_json()
    assert engine_label(spec) == label
    # a spec.json written before the defaults were recorded: every option that is on is named, as then
    old = {k: v for k, v in spec.items() if k != "engine_option_defaults"}
    assert engine_label(old).split()[1:] == [k for k, v in spec["engine_options"].items() if v is True]
