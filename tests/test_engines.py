"""Checkpoint engines: the engine cases of the run table (every engine that runs here, for dp=2 and tp=2 pp=2,
each engine's sync and async variant alternating over the layouts), clean refusals for engines that cannot run
here, the generated ds_config for every engine (read back by DeepSpeed's own config parser), bad engine input,
the typed engine interface, and the third_party shims checked against the dependency versions they address."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, RUNS, cases, events, load_summary, submit
from test_layouts import expected_files

from engines import _state_tree as state_tree
from engines import registry
from engines.base import Engine
from restart_harness import resolve
from restart_harness.command import parse_args
from restart_harness.errors import UsageError
from restart_harness.files.cache_dir import extensions_dir
from restart_harness.rundir.create import build_ds_config
from third_party.deepspeed_fastpersist_cpu import replica_name

CLOSE_CALL_SECONDS = 0.005  # step start is reconstructed from the event's wall time minus its seconds
SHARDED = cases("torchsnapshot-dp2", "torchsnapshot-async-tp2-pp2", "dcp-async-dp2", "dcp-tp2-pp2")
ASYNC = cases("torchsnapshot-async-tp2-pp2", "dcp-async-dp2", "fsdp2-async-dp2")


@pytest.mark.slow
@pytest.mark.parametrize("name", SHARDED)
def test_engine_saves_restarts_and_verifies(harness, name):
    spec = parse_args(RUNS[name].tokens)
    run_dir = harness.run(name)
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete"
    assert summary["restart"]["verified"] is True and summary["restart"]["ranks"] == spec.world_size
    assert summary["restart"]["tag"] == f"global_step{spec.iters}"
    # The inventory groups each engine's shards under DeepSpeed's file name: same kinds and writing ranks as the
    # default engine's files for this layout, and every DeepSpeed file is a directory of shards.
    inventory = json.loads((run_dir / "inventory.json").read_text())
    tops: dict[str, set] = collections.defaultdict(set)
    for f in inventory["files"]:
        top, _, rest = f["path"].partition("/")
        assert rest, f"{f['path']} is not inside a shard directory"
        tops[top].add((f["kind"], f["rank"]))
    want = expected_files(spec.tp, spec.pp, spec.dp, spec.shape.num_hidden_layers, spec.precision == "bf16")
    assert {top: kinds.pop() for top, kinds in tops.items() if len(kinds) == 1} == want
    assert inventory["by_kind"]["other"]["files"] == 0 and "unknown" not in inventory["by_rank"]
    assert inventory["total_entries"] == len(want) < inventory["total_files"]
    metadata = ".snapshot_metadata" if spec.engine == "torchsnapshot" else ".metadata"
    assert {f["path"].split("/")[0] for f in inventory["files"] if f["path"].endswith(metadata)} == set(want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ASYNC)
def test_async_saves_commit_only_when_durable_everywhere(harness, name):
    run_dir = harness.run(name)
    record = events(run_dir)
    saves = collections.defaultdict(dict)
    for rank, evs in record.items():
        for e in evs:
            if e["event"] == "save":
                saves[e["tag"]][rank] = e
    assert len(saves) == 3
    for tag, per_rank in saves.items():
        for e in per_rank.values():
            assert e["async"] is True
            assert 0 < e["blocking_seconds"] <= e["durable_seconds"] <= e["commit_seconds"]
        # `latest` was written after the slowest rank was durable (same host clock for every rank).
        durable_everywhere = max(e["start"] + e["durable_seconds"] for e in per_rank.values())
        committed = min(e["start"] + e["commit_seconds"] for e in per_rank.values())
        assert committed >= durable_everywhere, tag
    # A step is marked in_flight exactly when some save's flush (save return .. durable) overlapped it on that rank.
    for rank, evs in record.items():
        flushes = [(e["start"] + e["blocking_seconds"], e["start"] + e["durable_seconds"])
                   for e in evs if e["event"] == "save"]
        flagged = 0
        for step in (e for e in evs if e["event"] == "step"):
            end = step["t"]
            begin = end - step["seconds"]
            if any(abs(b - begin) < CLOSE_CALL_SECONDS for _, b in flushes):
                flagged += step["in_flight"]
                continue  # durable within the timestamps' resolution of the step's start: either answer is right
            assert step["in_flight"] == any(a < end and b > begin for a, b in flushes), step
            flagged += step["in_flight"]
        assert flagged == sum(e["in_flight_steps"] for e in evs if e["event"] == "save")
    summary = load_summary(run_dir)
    training = summary["training"]
    assert training["steps_in_flight"] == sum(1 for e in record[0] if e["event"] == "step" and e["in_flight"])
    assert all(s["async"] for s in summary["checkpoint"]["saves"])


@pytest.mark.slow
def test_sync_engine_has_no_flush_in_flight(harness):
    summary = load_summary(harness.run("torchsnapshot-dp2"))
    assert summary["training"]["steps_in_flight"] == 0
    assert summary["training"]["step_seconds_median_in_flight"] is None
    save = summary["checkpoint"]["saves"][0]
    assert save["async"] is False and save["in_flight_steps"] == 0
    assert save["blocking_seconds"] <= save["durable_seconds"] <= save["commit_seconds"]


# ---- engines that cannot run here, config generation, bad input ------------------------------------------

REFUSED_ON_CPU = {
    "datastates": "datastates-llm",
    "decoupled": "DeepSpeed 0.19.8",
}


@pytest.mark.parametrize("engine", list(REFUSED_ON_CPU))
def test_engine_that_cannot_run_here_is_refused(engine, tmp_path):
    results = tmp_path / "results"
    proc = submit(["tiny", f"engine={engine}", "device=cpu", f"results_dir={results}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: engine={engine} cannot run"), proc.stderr
    assert REFUSED_ON_CPU[engine] in lines[0]
    assert not results.exists()


BAD_ENGINE_INPUT = {
    "unknown engine": (["engine=floppy"], "floppy"),
    "option the engine does not take": (["engine=dcp", "async_take=true"], "an option of engine torchsnapshot"),
    "bad bool option value": (["engine=torchsnapshot", "async_take=maybe"], "async_take=maybe"),
    "bad int option value": (["engine=torchsnapshot", "memory_budget_mib=lots"], "memory_budget_mib=lots"),
    "bad choice option value": (["engine=fastpersist", "data_parallel=rack"], "data_parallel=rack"),
    "writers that would share a file": (["engine=fastpersist", "dp=2", "data_parallel=machine"],
                                        "data_parallel=machine with 2 ranks per node"),
}


@pytest.mark.parametrize("name", list(BAD_ENGINE_INPUT))
def test_bad_engine_input(name, tmp_path):
    tokens, named = BAD_ENGINE_INPUT[name]
    results = tmp_path / "results"
    proc = submit(["tiny", *tokens, f"results_dir={results}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not results.exists()


def _spec_for(engine: str, **options):
    """A resolved tiny dp=1 spec with engine set directly (the runnable check is preflight's: config only)."""
    return parse_args(["tiny", f"engine={engine}", *(f"{k}={str(v).lower()}" for k, v in options.items())])


def _deepspeed_reads(config: dict):
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(config)


@pytest.mark.parametrize("engine", registry.names())
def test_every_engine_generates_a_config_deepspeed_accepts(engine):
    config = build_ds_config(resolve.plugins(_spec_for(engine)))
    parsed = _deepspeed_reads(config)
    writer = parsed.checkpoint_config["writer"]
    if engine in ("fastpersist", "decoupled"):
        assert writer["type"] == "FAST" and writer["decoupled"] is (engine == "decoupled")
        assert writer["io_buffer_size"] == 64 * 2**20 and writer["data_parallel"] == "REPLICA"
    else:
        assert writer is None  # torchsnapshot and dcp are installed by the harness, not configured in DeepSpeed
    assert parsed.datastates_config.enabled is (engine == "datastates")


def test_datastates_block_follows_the_options():
    block = {"host_cache_size": 4.0, "engine_type": "state_engine", "parser_threads": 2}
    config = build_ds_config(resolve.plugins(_spec_for("datastates", host_cache_size=4, parser_threads=2)))
    assert config["datastates_ckpt"] == block
    assert _deepspeed_reads(config).datastates_config.config == block


@pytest.mark.parametrize("tokens", [["small"], ["small", "tp=2", "pp=2"], ["3B", "dp=2"]])
def test_datastates_host_cache_is_sized_to_what_a_rank_saves(tokens):
    """host_cache_size=auto (the default): the pinned cache DataStates allocates and page-locks at start-up holds the
    largest rank's save (the planner's bytes, each tensor 4 KiB-aligned), not a fixed 16 GB whatever the model."""
    from restart_harness.plan.checkpoint import stored_files

    spec = parse_args([*tokens, "engine=datastates"])
    gb = build_ds_config(resolve.plugins(spec))["datastates_ckpt"]["host_cache_size"]
    by_rank = collections.Counter()
    for f in stored_files(spec, resolve.plugins(spec).engine.files()):
        by_rank[f.rank] += f.bytes
    largest = max(by_rank.values())
    assert largest <= gb * 2**30 <= largest + (128 << 20), (gb, largest)


def test_writer_options_reach_the_config():
    config = build_ds_config(resolve.plugins(_spec_for("fastpersist", io_buffer_mib=8, io_multiplier=2,
                                                      data_parallel="socket", io_buffer_double=False)))
    writer = config["checkpoint"]["writer"]
    assert writer == {"type": "fast", "decoupled": False, "io_buffer_size": 8 * 2**20, "io_buffer_double": False,
                      "io_multiplier": 2, "data_parallel": "socket", "show_statistics": False}


def test_engine_options_parse_into_the_spec():
    spec = parse_args(["tiny", "engine=torchsnapshot", "async_take=true", "memory_budget_mib=64"])
    assert spec.engine_options == {"async_take": True, "memory_budget_mib": 64}
    assert parse_args(["tiny", "engine=dcp"]).engine_options == {"async_save": False}
    engine = resolve.plugins(spec).engine
    assert engine.options.async_take is True and engine.options.memory_budget_mib == 64 and engine.asynchronous()


def test_every_engine_is_one_typed_plug_in():
    """Each engine module holds one Engine subclass; everything the harness asks has a default on the base."""
    assert set(registry.names()) >= {"default", "none", "torchsnapshot", "dcp", "datastates", "fastpersist",
                                     "decoupled"}
    for name, cls in registry.all_engines().items():
        assert issubclass(cls, Engine) and cls.name == name and cls.description
        engine = cls(parse_args(["tiny", f"engine={name}"]))
        assert isinstance(engine.asynchronous(), bool) and isinstance(engine.ds_config(), dict)
    with pytest.raises(UsageError, match="engine=floppy: unknown engine"):
        registry.get("floppy")


# ---- the pieces the sharded engines are built from ------------------------------------------------------------

def test_relocate_follows_torch_load_map_location():
    tensors = {"t0": torch.arange(6.0).view(2, 3)[:, 1:]}
    same = state_tree.relocate(tensors, lambda storage, loc: storage)  # what DeepSpeed passes
    assert torch.equal(same["t0"], tensors["t0"]) and same["t0"].stride() == tensors["t0"].stride()
    assert state_tree.relocate(tensors, "cpu")["t0"].device.type == "cpu"
    assert state_tree.relocate(tensors, None) is tensors


def test_state_tree_round_trip_keeps_types_and_objects():
    w = torch.randn(3, 2, requires_grad=True)
    state = {"module": collections.OrderedDict(w=w, b=torch.ones(2, dtype=torch.bfloat16)),
             "cfg": {"zero": {"stage": 1}}, "n": None, "s": "x", "i": 7, "pair": (1, torch.zeros(1)), "l": [2.5]}
    tensors, skeleton = state_tree.split(state)
    assert list(tensors) == ["t0", "t1", "t2"] and not any(t.requires_grad for t in tensors.values())
    back = state_tree.merge({k: v.clone() for k, v in tensors.items()}, skeleton)
    assert type(back["module"]) is collections.OrderedDict and list(back["module"]) == ["w", "b"]
    assert torch.equal(back["module"]["w"], w.detach()) and back["module"]["b"].dtype == torch.bfloat16
    assert back["cfg"] == state["cfg"] and back["n"] is None and back["s"] == "x" and back["i"] == 7
    assert type(back["pair"]) is tuple and back["l"] == [2.5]


SHIM_CHECK = r"""
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
from torchsnapshot.pg_wrapper import PGWrapper
from torchsnapshot.io_preparers.tensor import TensorIOPreparer
from third_party.torchsnapshot_compat import single_process
assert PGWrapper(None).pg is not None          # torchsnapshot 0.1.0: None means WORLD once dist is up
with single_process():
    assert PGWrapper(None).pg is None and PGWrapper(None).get_world_size() == 1
assert PGWrapper(None).pg is not None          # restored after the block
entry, reqs = TensorIOPreparer.prepare_write("x", torch.ones(4), is_async_snapshot=True)
print("bug_present", not reqs[0].buffer_stager._should_copy_cpu_tensor())
"""


def test_torchsnapshot_shims_still_needed():
    """Fails (telling you to drop a shim) once torchsnapshot fixes the async CPU copy it works around."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", SHIM_CHECK], cwd=REPO, check=False, capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "PORT": str(port), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "bug_present True" in proc.stdout, "torchsnapshot copies CPU tensors in async_take now: drop the shim"


# ---- FastPersist on CPU: DeepSpeed's own FastCheckpointEngine, DeepNVMe's libaio writer ---------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", cases("fastpersist-dp2", "fastpersist-tp2-pp2-dp2"))
def test_fastpersist_writes_deepspeeds_replicas_and_restarts_from_them(harness, name):
    """Every file is DeepSpeed's name with the writer's `-R.N` (writer R of N data-parallel writers); each
    data-parallel rank writes its own whole replica of the model-states files (byte for byte the same stream);
    every byte goes through libaio (the counters see the writes); the restart reads them back and verifies."""
    import re

    spec = parse_args(RUNS[name].tokens)
    run_dir = harness.run(name)
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] is True
    tag = f"global_step{spec.iters}"
    folder = Path(resolve.read(run_dir).target.root / tag)
    names = sorted(p.name for p in folder.iterdir())
    by_base: dict[str, list[str]] = collections.defaultdict(list)
    for n in names:
        m = re.fullmatch(r"(.+\.pt)-(\d+)\.(\d+)", n)
        assert m and int(m.group(3)) == spec.dp and int(m.group(2)) < spec.dp, n
        assert replica_name(m.group(1), int(m.group(2)), spec.dp) == n  # the name engine=decoupled predicts
        by_base[m.group(1)].append(n)
    want = expected_files(spec.tp, spec.pp, spec.dp, spec.shape.num_hidden_layers, spec.precision == "bf16")
    assert set(by_base) == set(want)
    for base, replicas in by_base.items():
        if base.startswith("mp_rank_"):  # every data-parallel rank is a writer (data_parallel=replica)
            assert len(replicas) == spec.dp and len({(folder / r).read_bytes() for r in replicas}) == 1, base
        else:  # a rank's own ZeRO shard; a pipeline layer (dp rank 0 alone writes layers)
            assert len(replicas) == 1, base
    inventory = json.loads((run_dir / "inventory.json").read_text())
    assert inventory["by_kind"]["other"]["files"] == 0
    for rank, evs in events(run_dir).items():
        save = next(e for e in evs if e["event"] == "save" and e["tag"] == tag)
        assert save["anatomy"]["io"]["write"]["bytes"] >= save["bytes"] > 0, rank  # libaio's writes counted
        # the writer's own account: every byte it wrote went through libaio or its unaligned tail
        writer = save["engine_statistics"]
        assert writer["aio_bytes"] + writer["slow_bytes"] == save["bytes"], (rank, writer)


FASTPERSIST_SHIM_CHECK = r"""
import os, torch
os.environ["DS_ACCELERATOR"] = "cpu"
from types import SimpleNamespace
from deepspeed.io import fast_file_writer
from deepspeed.runtime.pipe.module import PipelineModule
from deepspeed.runtime.model_checkpointing.writer_factory import CheckpointWriterFactory
print("utils_not_implemented", type(fast_file_writer.UtilsBuilder()).__name__ == "NotImplementedBuilder")
writer = {"type": "FAST", "io_buffer_size": 4096, "io_buffer_double": True, "io_multiplier": 1, "show_statistics": False}
try:
    CheckpointWriterFactory(writer, {"use_gds": False}, None)
    print("pin_fails False")
except RuntimeError as exc:  # raised by the Tensor.pin_memory() of _setup_for_aio
    import traceback
    print("pin_fails", "pin_memory()" in traceback.extract_tb(exc.__traceback__)[-1].line)
folder = os.environ["FOLDER"]
open(os.path.join(folder, "layer_00-model_00-model_states.pt-0.2"), "wb").close()
print("replica_unseen", PipelineModule.ckpt_layer_path_list(SimpleNamespace(_local_start=0), folder, 0) == [])
"""


def test_fastpersist_cpu_shims_still_needed(tmp_path):
    """Fails (naming the shim to drop) once DeepSpeed no longer needs a work-around of
    third_party/deepspeed_fastpersist_cpu.py on its CPU accelerator."""
    proc = subprocess.run([sys.executable, "-c", FASTPERSIST_SHIM_CHECK], cwd=REPO, check=False, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "FOLDER": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "utils_not_implemented True" in proc.stdout, "fast_file_writer gets a UtilsBuilder on CPU: drop shim 2"
    assert "pin_fails True" in proc.stdout, "the writer's buffer pins on CPU without the native backend: drop shim 1"
    assert "replica_unseen True" in proc.stdout, "DeepSpeed finds X.pt-R.N files at load: drop shim 3"


def test_deepspeed_arch_list_shim_still_needed(monkeypatch):
    """third_party/deepspeed_arch_list.py: DeepSpeed's JIT builder stops on an architecture suffix that torch takes
    (an H200 image's TORCH_CUDA_ARCH_LIST=9.0a); the shim's list builds. Fails once DeepSpeed parses "9.0a" itself."""
    from deepspeed.ops.op_builder.async_io import AsyncIOBuilder

    from third_party import deepspeed_arch_list

    assert deepspeed_arch_list.plain("9.0a;10.0f+PTX 8.0") == "9.0;10.0+PTX;8.0"
    builder = AsyncIOBuilder()
    builder.jit_mode = True  # as in OpBuilder.jit_load; the list is read from the environment, no GPU asked
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    with pytest.raises(ValueError, match="'0a'"):
        builder.compute_capability_args()
    environ = {"TORCH_CUDA_ARCH_LIST": "9.0a"}
    assert deepspeed_arch_list.prepare(environ) == "9.0a" and deepspeed_arch_list.prepare(environ) is None
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", environ["TORCH_CUDA_ARCH_LIST"])
    builder.compute_capability_args()
    assert __import__("os").environ["TORCH_CUDA_ARCH_LIST"] == "9.0+PTX"  # what DeepSpeed then hands torch


def test_deepspeed_decoupled_shim_still_needed():
    """third_party/deepspeed_decoupled_grad.py: a slice of a flat buffer that requires grad (ZeRO's fp32 partition)
    cannot go on DecoupledCheckpointEngine's queue; detached, the same storage can. Fails once DeepSpeed detaches."""
    import inspect
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # registers torch's reductions, as DeepSpeed's queue does
    from deepspeed.runtime.checkpoint_engine.decoupled_checkpoint_engine import DecoupledCheckpointEngine

    from third_party.deepspeed_decoupled_grad import detached

    flat = torch.zeros(8, requires_grad=True)
    state = {"optimizer_state_dict": {"single_partition_of_fp32_groups": [flat[2:6] * 1], "step": 3}, "tag": "x"}
    with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
        ForkingPickler.dumps(state)
    ready = detached(state)
    part = ready["optimizer_state_dict"]["single_partition_of_fp32_groups"][0]
    assert not part.requires_grad and part.data_ptr() == state["optimizer_state_dict"][
        "single_partition_of_fp32_groups"][0].data_ptr()
    assert ready["optimizer_state_dict"]["step"] == 3 and ready["tag"] == "x"
    module = collections.OrderedDict(w=torch.ones(2))
    module._metadata = {"": {"version": 1}}
    assert detached(module) is module  # nothing to detach: DeepSpeed's own object
    module["g"] = flat[:2] * 1
    assert detached(module)._metadata == {"": {"version": 1}} and not detached(module)["g"].requires_grad
    ForkingPickler.dumps(ready)
    assert "detach" not in inspect.getsource(DecoupledCheckpointEngine.save), "DeepSpeed detaches: drop the shim"


def _without_ipc_lock(command: str, memlock_kib: int) -> subprocess.CompletedProcess:
    """command in bash as a process without CAP_IPC_LOCK (root's is dropped) whose locked-memory limit is
    memlock_kib: what a non-root user on a default node gets."""
    return subprocess.run(["setpriv", "--bounding-set", "-ipc_lock", "--inh-caps", "-ipc_lock", "bash", "-c",
                           f"ulimit -l {memlock_kib}; {command}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)


def test_fastpersist_refuses_a_locked_memory_limit_below_its_buffer(tmp_path):
    results = tmp_path / "results"
    proc = _without_ipc_lock(f"./submit-job.sh tiny dp=2 engine=fastpersist results_dir={results}", 1024)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "may lock 1024 KiB (ulimit -l)" in lines[0] and "io_buffer_mib" in lines[0], lines
    assert not results.exists()
    # a buffer within the limit is accepted (nothing launched: a dry run)
    proc = _without_ipc_lock(f"./submit-job.sh tiny dp=2 engine=fastpersist io_buffer_mib=1 dry_run=true "
                             f"results_dir={results}", 2048)
    assert proc.returncode == 0, proc.stderr


def test_deepspeed_still_aborts_a_rank_whose_buffer_cannot_be_locked():
    """Why the refusal above exists: DeepSpeed 0.19.8's native pinned memory aborts the process (a C assertion)
    when mlock fails. Fails once DeepSpeed raises a Python error instead: then the rank's own error suffices."""
    script = ("import torch; from deepspeed.accelerator import get_accelerator; "
              "get_accelerator().pin_memory(torch.empty(64 << 20, dtype=torch.uint8), make_copy=False)")
    env = f"DS_ACCELERATOR=cpu DS_PIN_MEMORY_BACKEND=native TORCH_EXTENSIONS_DIR={extensions_dir()}"
    proc = _without_ipc_lock(f"{env} {sys.executable} -c '{script}'", 1024)
    aborted = proc.returncode in (-signal.SIGABRT, 128 + signal.SIGABRT)  # bash may exec it or report its signal
    assert aborted and "deepspeed_pin_tensor" in proc.stderr, (proc.returncode, proc.stderr[-2000:])


def test_async_io_engines_are_refused_where_libaio_is_missing(tmp_path):
    """A node without libaio (hidden here in a mount namespace, tests/hidden_libaio.py): engine=fastpersist and
    engine=decoupled need DeepSpeed's async_io op, which could not build on such a GPU node (2026-11-26). Each is
    refused in one line naming libaio before anything is created - decoupled with device=cuda in the same line as
    device=cuda's own refusal on this CPU machine (every failed node check is named). With libaio's files in a folder
    of their own, pointed at by CPATH, LIBRARY_PATH and LD_LIBRARY_PATH (how a node carries them), the check passes."""
    import hidden_libaio

    results = tmp_path / "results"
    for engine, device in (("fastpersist", "cpu"), ("decoupled", "cuda")):
        proc = hidden_libaio.run(hidden_libaio.quoted(sys.executable, str(REPO / "config-n-run.py"), "tiny",
                                                      f"engine={engine}", f"device={device}",
                                                      f"results_dir={results}"), tmp_path / engine, cwd=REPO)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
        assert f"engine={engine} cannot run on this node: DeepSpeed's async_io op" in lines[0], lines
        assert "libaio.so.1 is not installed" in lines[0], lines
        assert (f"device={device} cannot run on this node" in lines[0]) is (device == "cuda"), lines
    assert not results.exists()
    # libaio carried as files: the same check passes (no run: the check itself, as preflight calls it)
    carried = tmp_path / "libaio"
    (carried / "include").mkdir(parents=True)
    (carried / "lib").mkdir()
    shutil.copy2("/usr/include/libaio.h", carried / "include")
    for lib in Path(hidden_libaio.LIBDIR).glob("libaio.so*"):
        shutil.copy2(lib, carried / "lib", follow_symlinks=True)
    check = ("from restart_harness.command import parse_args; from restart_harness import nodecheck, resolve; "
             "nodecheck.here(resolve.plugins(parse_args(['tiny', 'engine=fastpersist', 'device=cpu']))); "
             "print('accepted')")
    env = {**os.environ, "CPATH": str(carried / "include"), "LIBRARY_PATH": str(carried / "lib"),
           "LD_LIBRARY_PATH": str(carried / "lib")}
    ok = hidden_libaio.run(hidden_libaio.quoted(sys.executable, "-c", check), tmp_path / "ns2", env=env, cwd=REPO)
    assert ok.returncode == 0 and ok.stdout.strip() == "accepted", ok.stdout + ok.stderr


SHARED_DATASTATES = REPO.parent / "shared" / "deps" / "datastates-llm"  # the assembled trees (shared/ beside the clone)


@pytest.mark.parametrize("commit, named", [
    ("ebc6762", "StateCheckpointEngine.load does not accept a callable map_location"),
    ("1b84990", "has no compiled core (datastates_core*.so"),
    ("2024", "no package `datastates` whose __init__.py binds CheckpointEngine")])
def test_datastates_installed_but_unusable_is_refused_in_one_line(tmp_path, commit, named):
    """A node whose `datastates` imports but is not what DeepSpeed 0.19.8 can use - the pin before (ebc6762: its load
    exits on DeepSpeed's callable map_location), the pinned Python package without its CMake-built core, the
    repository's 2024 layout - is refused before anything is created, in one line naming what is missing (beside
    device=cuda's own refusal on this CPU machine) and what is accepted."""
    site = tmp_path / "site"
    if commit == "2024":
        (site / "datastates" / "llm").mkdir(parents=True)
        (site / "datastates" / "llm" / "__init__.py").write_text("class Checkpointing:\n    def wait(self): pass\n")
    else:
        tarball = SHARED_DATASTATES / f"datastates-llm-{commit}-assembled.tar.gz"
        if not tarball.is_file():
            pytest.skip(f"{tarball} is not here (the shared folder of assembled DataStates-LLM trees)")
        subprocess.run(["tar", "-C", str(tmp_path), "-xzf", str(tarball)], check=True)
        shutil.copytree(next(tmp_path.glob("datastates-llm-*")) / "llm" / "datastates", site / "datastates")
    results = tmp_path / "results"
    proc = submit(["tiny", "engine=datastates", "device=cuda", f"results_dir={results}"], tmp_path,
                  env={"PYTHONPATH": str(site)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "engine=datastates cannot run on this node" in lines[0] and named in lines[0], lines
    assert "scripts/bundle/datastates-llm.pin" in lines[0] and not results.exists()


@pytest.mark.slow  # two processes importing DeepSpeed (about 15 s on an idle machine here)
def test_decoupled_writer_death_names_its_cause(tmp_path):
    """DeepSpeed 0.19.8's real DecoupledCheckpointEngine on CPU, whose spawned writer process dies at once (it cannot
    pin its buffer without an accelerator): DeepSpeed alone tells the rank only that the process is not running
    (test_deepspeed_decoupled_cause_shim_still_needed); with third_party/deepspeed_decoupled_cause.py the rank's error
    carries the writer's own exception and exit code."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions_dir())}
    proc = subprocess.run([sys.executable, str(REPO / "tests/data/decoupled_writer_dies.py"), "shim"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    said = [x for x in proc.stdout.splitlines() if x.startswith("ERROR: ")]
    assert said, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("decoupled checkpoint writer (process" in said[-1] and "exit code 1" in said[-1]
            and "RuntimeError: Cannot access accelerator device when none is available" in said[-1]
            and "checkpoint process is not running" in said[-1]), said  # DeepSpeed's own words kept after the cause


def test_deepspeed_decoupled_cause_shim_still_needed():
    """Why deepspeed_decoupled_cause.py exists: DeepSpeed 0.19.8's commit says only that its writer process died or is
    not running, and its save returns silently into a dead process. Fails once DeepSpeed's errors read the writer's."""
    import inspect

    from deepspeed.runtime.checkpoint_engine import decoupled_checkpoint_engine as dce

    source = inspect.getsource(dce)
    assert "Checkpoint process died unexpectedly" in source and "checkpoint process is not running" in source
    assert "exitcode" not in source and "traceback" not in source, "DeepSpeed reports its writer's cause: drop the shim"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_engine_none_trains_without_checkpoints(harness):
    run_dir = harness.run("none-dp2")
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete" and summary["restart"] is None
    assert summary["checkpoint"]["saves"] == [] and summary["training"]["steps"] == 2
    assert summary["training"]["steps_in_flight"] == 0
    assert not (run_dir / "checkpoint" / "latest").exists()


@pytest.mark.slow
def test_async_kill_mid_save_keeps_latest_on_the_last_durable_checkpoint(harness):
    """Issue 8 item 1 for an async engine: rank 1 dies while global_step4 is being written; `latest` still names
    global_step2, whose flush was committed only after every rank was durable."""
    run_dir = harness.run("dcp-async-killed-mid-save")
    assert (run_dir / "checkpoint" / "latest").read_text() == "global_step2"
    committed = {rank: [e["tag"] for e in evs if e["event"] == "save"] for rank, evs in events(run_dir).items()}
    assert committed == {0: ["global_step2"], 1: ["global_step2"]}
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "failed" and summary["checkpoint"]["tag"] == "global_step2"


@pytest.mark.slow
def test_no_shared_memory_left_behind(harness):
    """third_party/deepspeed_shm_unlink: finished launches leave no DeepSpeed allreduce buffer in /dev/shm."""
    import re

    for run_dir in (harness.run(name) for name in SHARDED):
        # DeepSpeed's launcher takes it as --master_port, the others' scripts export MASTER_PORT
        port = re.search(r"(?:--master_port |MASTER_PORT=)(\d+)",
                         (run_dir / "launch-checkpoint.sh").read_text()).group(1)
        assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*")), run_dir.name
