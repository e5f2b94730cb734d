"""emulate=true: the emulated checkpoint is the real one file by file (names, kinds, writing ranks, sizes, and the
whole structure of every state dict), its data cannot be compressed or de-duplicated, its restart reads exactly
what DeepSpeed's load_checkpoint reads and verifies it, memory is bounded by waves, and bad input is refused."""

from __future__ import annotations

import enum
import hashlib
import json
import zlib
from pathlib import Path

import pytest
import torch
from conftest import RUNS, cases, events, load_summary, run_cli, run_dir_of

from restart_harness import resolve
from restart_harness.command import parse_args

# Each emulated case (conftest.RUNS) beside the real run it must equal (same model, layout, engine, last step).
PAIRS = {"emulated-tiny-dp2": "tiny-dp2", "emulated-tp2-pp2": "tp2-pp2", "emulated-dcp-tp2-pp2": "dcp-tp2-pp2",
         "emulated-zero3-tp2-dp2": "zero3-tp2-dp2"}
cases(*PAIRS, *PAIRS.values())


def _inventory(run_dir: Path) -> dict[str, dict]:
    return {f["path"]: f for f in json.loads((run_dir / "inventory.json").read_text())["files"]}


def structure_differences(a: object, b: object, path: str = "") -> list[str]:
    """Where two loaded state dicts differ: types, keys and their order, tensor dtype/shape/storage size, every
    non-tensor value (objects by their attributes). Tensor values are not compared (emulated data is random)."""
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and \
            a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
        return [] if same else [f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"]
    if isinstance(a, dict):
        if list(a) != list(b):
            return [f"{path}: keys {list(a)} != {list(b)}"]
        out = structure_differences(getattr(a, "_metadata", None), getattr(b, "_metadata", None), f"{path}._metadata")
        return out + [d for k in a for d in structure_differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in structure_differences(x, y, f"{path}/{i}")]
    if hasattr(a, "__dict__") and not isinstance(a, enum.Enum):
        return structure_differences(vars(a), vars(b), f"{path}.__dict__")
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("emulated", list(PAIRS))
def test_emulated_files_equal_the_real_ones(harness, emulated):
    """Names, kinds and writing ranks exactly; each DeepSpeed file's size (a sharded engine's directory: all its
    shards) within 1%; the torch.save files here to the byte. (DCP's .metadata holds the checkpoint's own path,
    which differs between two run directories by a few bytes.)"""
    real, emu = _inventory(harness.run(PAIRS[emulated])), _inventory(harness.run(emulated))
    assert sorted(emu) == sorted(real)
    entries: dict[str, list[int]] = {}
    for path, f in real.items():
        assert (emu[path]["kind"], emu[path]["rank"]) == (f["kind"], f["rank"]), path
        sizes = entries.setdefault(path.split("/")[0], [0, 0])
        sizes[0] += f["bytes"]
        sizes[1] += emu[path]["bytes"]
    for entry, (real_bytes, emu_bytes) in entries.items():
        assert emu_bytes == pytest.approx(real_bytes, rel=0.01), entry
    if "engine=" not in RUNS[emulated].args or "engine=default" in RUNS[emulated].args:
        assert all(emu[p]["bytes"] == f["bytes"] for p, f in real.items())


@pytest.mark.slow
@pytest.mark.parametrize("real", cases("zero2-dp2", "zero3-dp2"))
def test_emulated_zero_files_are_deepspeeds_to_the_byte(harness, real, tmp_path):
    """Every file of a real ZeRO-2 or ZeRO-3 checkpoint against the state dict emulation builds for it (in this
    process, saved with torch.save under the same name): the same size to the byte and the same structure."""
    from restart_harness.plan import checkpoint
    from restart_harness.spec.runspec import RunSpec
    from restart_harness.stacks._deepspeed_files import Filler, build_state
    from restart_harness.stacks.deepspeed import client_state

    run_dir = harness.run(real)
    spec = RunSpec.from_json(json.loads((run_dir / "spec.json").read_text()))
    config = json.loads((run_dir / "ds_config.json").read_text())
    tag_dir = Path(load_summary(run_dir)["checkpoint"]["dir"])
    filler = Filler(0, spec.seed)
    for recipe in checkpoint.recipes(spec):
        out = tmp_path / recipe.path
        torch.save(build_state(spec, recipe, filler, config, client_state(spec, 2)), out)
        assert out.stat().st_size == (tag_dir / recipe.path).stat().st_size, recipe.path
        a = torch.load(tag_dir / recipe.path, map_location="cpu", weights_only=False)
        assert structure_differences(a, torch.load(out, map_location="cpu", weights_only=False)) == [], recipe.path


def _open(spec):
    """The run's engine as an emulated rank opens it (DeepSpeed's TorchCheckpointEngine beneath), on a file system."""
    from engines.base import EngineContext
    from restart_harness.stacks.emulated import native_engine
    from restart_harness.targets.filesystem import FileSystemStore, FileSystemTarget

    native = native_engine()
    return resolve.plugins(spec).engine.open(EngineContext(spec, FileSystemStore(FileSystemTarget(None)), native=native))


@pytest.mark.slow
@pytest.mark.parametrize("emulated", list(PAIRS))
def test_every_emulated_state_dict_is_deepspeeds(harness, emulated):
    """Each file, loaded through the run's own engine: the same state dict as the real run's, key by key."""
    real_dir, emu_dir = harness.run(PAIRS[emulated]), harness.run(emulated)
    spec = parse_args(RUNS[emulated].tokens)
    engine = _open(spec)
    real_tag = Path(load_summary(real_dir)["checkpoint"]["dir"])
    emu_tag = Path(load_summary(emu_dir)["checkpoint"]["dir"])
    assert real_tag.name == emu_tag.name
    tops = sorted({p.split("/")[0] for p in _inventory(real_dir)})
    for top in tops:
        a = engine.load(str(real_tag / top), map_location="cpu")
        b = engine.load(str(emu_tag / top), map_location="cpu")
        assert structure_differences(a, b) == [], top


@pytest.mark.slow
@pytest.mark.parametrize("emulated", list(PAIRS))
def test_emulated_restart_reads_what_deepspeed_reads_and_verifies(harness, emulated):
    real_dir, emu_dir = harness.run(PAIRS[emulated]), harness.run(emulated)
    summary = load_summary(emu_dir)
    restart = summary["restart"]
    assert summary["spec"]["emulate"] is True and summary["status"]["state"] == "complete"
    assert restart["verified"] is True and restart["verified_tensors"] > 0
    # phases that do not apply are absent, not zero
    assert set(restart["phases"]) == {"imports", "dist_init", "checkpoint_load"}
    assert summary["training"]["steps"] == 0 and summary["training"]["step_seconds_median"] is None
    # the same engine.load calls, in the same order, as DeepSpeed's load_checkpoint made in the real restart
    for rank, evs in events(real_dir, "restart-01").items():
        real_calls = [Path(f["path"]).name for f in next(e for e in evs if e["event"] == "loaded")["files"]]
        emu_evs = events(emu_dir, "restart-01")[rank]
        emu_calls = [Path(f["path"]).name for f in next(e for e in emu_evs if e["event"] == "loaded")["files"]]
        assert emu_calls == real_calls, rank
    lb = restart["load_breakdown"]
    for row in lb["per_rank"]:
        assert row["read_bytes"] > 0 and row["copy_seconds"] == 0.0


@pytest.mark.slow
def test_emulated_data_is_neither_compressible_nor_deduplicable(harness):
    tag_dir = Path(load_summary(harness.run("emulated-tiny-dp2"))["checkpoint"]["dir"])
    seen: set[bytes] = set()
    blocks = 0
    for path in sorted(tag_dir.glob("*.pt")):
        data = path.read_bytes()
        assert len(zlib.compress(data, 6)) > 0.98 * len(data), path.name
        for i in range(0, len(data) - 4096, 4096):
            seen.add(hashlib.blake2b(data[i:i + 4096], digest_size=16).digest())
            blocks += 1
    assert len(seen) == blocks  # no 4 KiB block repeats, within a file or across files


@pytest.mark.slow
def test_memory_budget_makes_ranks_work_in_waves(harness):
    """tiny dp=4: a rank's largest file (its optimizer partition) needs 1.5 MB with what the engine stages beside
    it; a budget of 1.6 MB lets one rank work at a time."""
    run_dir = harness.run("emulated-waves-dp4")
    saves = [e for evs in events(run_dir).values() for e in evs if e["event"] == "save"]
    assert len(saves) == 4 and all(e["waves"] == 4 for e in saves)
    starts = sorted((e["wave_start"], e["rank"]) for e in saves)
    assert [r for _, r in starts] == [0, 1, 2, 3]  # the waves run in rank order
    ends = sorted((e["wave_end"], e["rank"]) for e in saves)
    assert all(end <= later for (end, _), (later, _) in zip(ends, starts[1:], strict=False))
    # the node's storage saw one writer at a time (each rank's wave, not its save window, which holds the waiting)
    (node,) = load_summary(run_dir)["checkpoint"]["saves"][-1]["per_node"]
    assert node["concurrent_writers_max"] == 1 and node["writers"] == 4
    assert json.loads((run_dir / "spec.json").read_text())["emulate_memory_gib"] == 0.0015


@pytest.mark.slow
def test_a_load_in_waves_leaves_out_the_other_waves(harness):
    """The restart loads in the save's waves too: each rank's checkpoint_load is its own wave's load, as its save is
    its own wave's save, so its waiting for the other ranks' waves (and its verification) is left out, and the
    anatomy's window, which excludes the same regions, accounts for the same seconds."""
    run_dir = harness.run("emulated-waves-dp4")
    record = events(run_dir, "restart-01")
    restart = load_summary(run_dir)["restarts"][0]
    for rank in restart["per_rank"]:
        evs = record[rank["rank"]]
        (loaded,) = [e for e in evs if e["event"] == "loaded"]
        (window,) = [e for e in evs if e["event"] == "load_anatomy"]
        span = rank["marks"]["checkpoint_loaded"] - rank["marks"]["engine_initialized"]
        assert loaded["untimed_seconds"] > 0  # every rank waits at each of the 4 waves' barriers
        assert rank["phases"]["checkpoint_load"] == pytest.approx(span - loaded["untimed_seconds"], abs=1e-5)
        assert rank["phases"]["checkpoint_load"] == pytest.approx(window["window_seconds"], abs=0.02)


BAD = {
    "engine that DeepSpeed builds": (["tiny", "emulate=true", "engine=none"], "cannot emulate engine=none"),
    "no memory": (["tiny", "emulate=true", "emulate_memory_gib=0"], "emulate_memory_gib=0"),
    "a file larger than the budget": (["3B", "emulate=true", "engine=dcp", "emulate_memory_gib=1"],
                                      "the largest file needs"),
    "streaming in less than its buffers": (["3B", "emulate=true", "emulate_memory_gib=0.1"],
                                           "streaming its files needs 0.25 GiB of memory"),
    "no room for the checkpoint": (["70B", "tp=8", "pp=4", "dp=2", "emulate=true", "emulate_memory_gib=64",
                                    "ckpt_dir=/dev/shm/rh-emu"], "MiB free"),
    "the reference cell, streamed, where the disk lacks room": (["3B", "tp=4", "emulate=true",
                                                                 "ckpt_dir=/dev/shm/rh-emu"], "MiB (planned) but"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_emulation_input(name, tmp_path):
    tokens, named = BAD[name]
    proc = run_cli(tokens, tmp_path / "results", check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], proc.stderr
    assert not (tmp_path / "results").exists() and not Path("/dev/shm/rh-emu").exists()


def test_70B_emulation_on_slurm_is_one_command(tmp_path):
    """The real 70B layout (no shrink), emulated on 8 nodes x 8 ranks: the job script is generated and checked here;
    the memory budget is left to the compute node."""
    proc = run_cli(["70B", "tp=8", "pp=4", "dp=2", "nodes=8", "ranks_per_node=8", "emulate=true", "launcher=slurm",
                    "dry_run=true", "walltime=02:00:00"], tmp_path / "results")
    run_dir = run_dir_of(proc)
    job = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=8" in job and "#SBATCH --ntasks-per-node=8" in job and "#SBATCH --time=02:00:00" in job
    launch = (run_dir / "launch-checkpoint.sh").read_text()
    assert "srun --nodes=8 --ntasks=64 --ntasks-per-node=8" in launch
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["emulate"] is True and spec["emulate_memory_gib"] is None and spec["shrink"] == 1
    assert spec["derived"]["num_parameters"] > 70e9


# ---- streamed files (stacks/_streamed.py): torch's own bytes, in bounded memory ------------------------------------
def _no_untimed(category):
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("tokens", [["tiny", "dp=2"], ["tiny", "tp=2", "pp=2"], ["tiny", "zero=3", "tp=2", "dp=2"]])
def test_streamed_files_are_torch_saves_to_the_byte(tokens, tmp_path, monkeypatch):
    """Every file of a layout, streamed in chunks that split 4 KiB blocks, digest blocks and tensors: the bytes
    torch.save writes for the same state filled in memory, its digests those of the filled tensors, and read back
    (torch.load with mmap, the data read in chunks) to the same digests."""
    from restart_harness.model import digest
    from restart_harness.plan import checkpoint
    from restart_harness.rundir.create import build_ds_config
    from restart_harness.stacks import _streamed
    from restart_harness.stacks._deepspeed_files import Filler, build_state, tensors_of
    from restart_harness.stacks.deepspeed import client_state
    from restart_harness.stacks.emulated import native_engine

    monkeypatch.setattr(_streamed, "STREAM_CHUNK_BYTES", 3 * 4096)
    spec = parse_args([*tokens, "emulate=true"])
    config = build_ds_config(resolve.plugins(spec))
    eager, lazy, native = Filler(0, spec.seed), Filler(0, spec.seed, lazy=True), native_engine()
    native.streams, native.untimed = True, _no_untimed
    for recipe in checkpoint.recipes(spec):
        held, streamed = tmp_path / "held" / recipe.path, tmp_path / "streamed" / recipe.path
        held.parent.mkdir(parents=True, exist_ok=True)
        streamed.parent.mkdir(parents=True, exist_ok=True)
        state = build_state(spec, recipe, eager, config, client_state(spec, 2))
        torch.save(state, held)
        expected = {k: digest.tensor_digest(t) for k, t in tensors_of(state).items()}
        lazy.fills.clear()
        state = build_state(spec, recipe, lazy, config, client_state(spec, 2))
        native.fill = _streamed.Fill(state, lazy, dict(lazy.fills), _no_untimed)
        native.save(state, str(streamed))
        assert streamed.read_bytes() == held.read_bytes(), recipe.path
        assert native.fill.digests == expected, recipe.path
        loaded = native.load(str(streamed), map_location="cpu")
        assert native.digests == expected, recipe.path
        assert structure_differences(loaded, torch.load(held, map_location="cpu", weights_only=False)) == []


STREAM_CHILD = """
import resource, sys, contextlib, torch
from restart_harness.stacks import _streamed
from restart_harness.stacks._deepspeed_files import Filler
from restart_harness.stacks.emulated import native_engine
path, nbytes = sys.argv[1], int(sys.argv[2])
native, filler = native_engine(), Filler(0, 1, lazy=True)
native.streams, native.untimed = True, lambda c: contextlib.nullcontext()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
state = {"exp_avg": filler.fill(torch.empty(nbytes // 4, dtype=torch.float32)), "step": torch.tensor(2.0)}
native.fill = _streamed.Fill(state, filler, dict(filler.fills), lambda c: contextlib.nullcontext())
native.save(state, path)
native.load(path, map_location="cpu")
assert native.digests == native.fill.digests
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_streaming_a_file_holds_a_bounded_memory(tmp_path):
    """A child process streams a file four times the bound a streaming rank is planned at (plan/checkpoint.py), and
    reads it back and verifies it: its peak resident memory grows by less than that bound."""
    import subprocess
    import sys

    from restart_harness.plan.checkpoint import EMULATED_STREAM_BYTES

    nbytes = 4 * EMULATED_STREAM_BYTES
    proc = subprocess.run([sys.executable, "-c", STREAM_CHILD, str(tmp_path / "big.pt"), str(nbytes)],
                          capture_output=True, text=True, check=True, timeout=600)
    before, after = map(int, proc.stdout.split()[-2:])
    assert (tmp_path / "big.pt").stat().st_size > nbytes
    assert after - before < EMULATED_STREAM_BYTES, (before, after)
    assert torch.load(tmp_path / "big.pt", mmap=True, weights_only=False)["step"].item() == 2.0


@pytest.mark.slow
def test_a_streamed_emulation_restarts_and_verifies(tmp_path):
    """3B tp=4 shrink=8, whose files are large enough to stream: the whole run writes them streamed, restarts and
    verifies every tensor, and each file is torch's to torch.load (its data as the save's digests said)."""
    from restart_harness.model import digest
    from restart_harness.stacks._deepspeed_files import tensors_of

    proc = run_cli(["3B", "tp=4", "shrink=8", "emulate=true", "iters=1", "save_interval=1", "baseline=false"],
                   tmp_path / "results", timeout=1200)
    run_dir = run_dir_of(proc)
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete" and summary["restart"]["verified"] is True
    saves = [e for evs in events(run_dir).values() for e in evs if e["event"] == "save"]
    assert saves and all(e["streamed"] for e in saves)
    tag_dir = Path(summary["checkpoint"]["dir"])
    saved = json.loads((run_dir / "digests" / tag_dir.name / "emulated-rank-00000.json").read_text())["files"]
    name = min(saved)
    state = torch.load(tag_dir / name, map_location="cpu", weights_only=False)
    assert {k: digest.tensor_digest(t) for k, t in tensors_of(state).items()} == saved[name]
