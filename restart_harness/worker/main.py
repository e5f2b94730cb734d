"""One rank of one phase: build the model, train, checkpoint (phase=checkpoint) or restart from the
committed checkpoint, verify it, and train on (phase=restart). Every fact goes to the rank's event log."""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
import traceback
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

from engines import registry
from restart_harness.spec.runspec import RunSpec
from restart_harness.storage.atomic import read_json, write_json_atomic
from restart_harness.worker import async_save, checkpointing, digest, faults, full_state
from restart_harness.worker.anatomy import Anatomy, peak_rss_bytes_since_last
from restart_harness.worker.data import step_batches
from restart_harness.worker.events import EventLog
from restart_harness.worker.model import LlamaForCausalLM, pipeline_module
from restart_harness.worker.tensor_parallel import TPGroup
from third_party.deepspeed_shm_unlink import unlink_own_buffer


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--phase", choices=("checkpoint", "restart"), required=True)
    p.add_argument("--record", required=True, help="event folder name: checkpoint, restart-01, ...")
    p.add_argument("--ckpt-root", type=Path, required=True)
    p.add_argument("--spec", type=Path, help="this launch's spec (a restart at another layout); default the run's")
    p.add_argument("--ds-config", type=Path, help="this launch's DeepSpeed config; default the run's")
    p.add_argument("--load-tag", help="restart: the tag to load (a universal checkpoint); default what latest names")
    p.add_argument("--full-state-reference", type=Path,
                   help="restart: verify the full state against these digests (a restart at another layout)")
    return p.parse_args(argv)


def main(process_start: float, argv=None) -> int:
    args = parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    log = EventLog(args.run_dir / "events" / args.record / f"rank-{rank:05d}.jsonl", rank, _peak_memory)
    log.emit("process", pid=os.getpid())
    log.mark("process_start", t=process_start)
    log.mark("imports_done")
    try:
        run(args, log, rank)
        # Linux reports ru_maxrss in KiB: the peak resident memory of this rank's process.
        log.emit("done", max_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return 0
    except BaseException as exc:  # recorded for the summary, then re-raised so the launch fails
        log.emit("error", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        raise
    finally:
        log.close()


def run(args: argparse.Namespace, log: EventLog, rank: int) -> None:
    spec = RunSpec.from_json(read_json(args.spec or args.run_dir / "spec.json"))
    ds_config = read_json(args.ds_config or args.run_dir / "ds_config.json")
    plugin = registry.get(spec.engine)(spec)
    checkpointing.object_store(args.run_dir, args.ckpt_root, plugin)
    if spec.stack == "fsdp2":
        from restart_harness.worker import fsdp2

        fsdp2.run(args, log, rank, spec, plugin, _peak_memory)
        return
    if spec.emulate:
        from restart_harness.worker import emulate

        emulate.run(args, log, rank, spec, ds_config, plugin, _init_distributed)
        return
    device = _init_distributed(spec)
    log.mark("dist_init_done")

    grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(spec.pp, spec.tp, spec.dp))
    tp = TPGroup(grid.get_slice_parallel_group(), grid.get_slice_parallel_rank(), spec.tp)
    topo = grid._topo
    if spec.pp > 1:
        model = pipeline_module(spec.shape, tp, spec.seed, topo)
    else:
        model = LlamaForCausalLM(spec.shape, tp, spec.seed)
    log.mark("model_built")

    params = [p for p in model.parameters() if p.requires_grad]
    mpu = None if spec.pp > 1 else grid
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config, mpu=mpu)
    anatomy = Anatomy(device.type, enabled=spec.anatomy)
    anatomy.add_prefix(args.ckpt_root)
    recorder = checkpointing.install(engine, plugin, anatomy)
    log.emit("layout", dp_rank=grid.get_data_parallel_rank(), tp_rank=tp.rank,
             pp_rank=grid.get_pipe_parallel_rank(), device=str(device),
             local_parameters=sum(p.numel() for p in params))

    first, last = 1, spec.iters
    _sync(device)  # deepspeed.initialize's moves to the device are part of engine_init, not of what follows
    if args.phase != "restart":
        log.mark("engine_initialized")
    else:
        tag, client_state = checkpointing.measured_load(engine, recorder, args.ckpt_root, args.load_tag, log,
                                                        _peak_memory, lambda: _sync(device))
        if args.full_state_reference:
            _verify_full_state(args.full_state_reference, tag, engine, model, spec, grid, log)
        else:
            _verify(args.run_dir, tag, engine, rank, log)
        first = int(client_state["harness_step"]) + 1
        last = first + spec.after - 1

    saves = plugin.saves and args.phase == "checkpoint"
    saver = async_save.Saver(engine, recorder, plugin, args.ckpt_root, rank, dist.barrier,
                             lambda flag: _all_true(flag, device))
    for step in range(first, last + 1):
        faults.hit("step", rank, step, where=str(args.ckpt_root))
        start = time.perf_counter()
        loss = _train_step(engine, spec, step, grid, device)
        seconds = time.perf_counter() - start
        log.emit("step", step=step, loss=loss, seconds=seconds, last=last, in_flight=saver.overlapped(start))
        if step == first and args.phase == "restart":
            log.mark("first_step_done")
        _emit_save(log, saver.poll())  # an async save commits at the first step boundary where all are durable
        if saves and step % spec.save_interval == 0:
            _emit_save(log, saver.finish())  # never two flushes in flight
            _save(args, engine, saver, step, rank, log)
    _emit_save(log, saver.finish())
    dist.barrier()
    log.mark("finished")


def _sync(device: torch.device) -> None:
    """A timer that stops while device work is still queued measures nothing: wait for it (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory() -> dict:
    """The phase's memory high-water marks (host RSS; allocated device memory on CUDA), reset for the next one."""
    out = {"peak_rss_bytes": peak_rss_bytes_since_last()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    return out


def _all_true(flag: bool, device: torch.device) -> bool:
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def _emit_save(log: EventLog, record: dict | None) -> None:
    if record is not None:
        log.emit("save", **record)


def _init_distributed(spec: RunSpec) -> torch.device:
    if spec.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        deepspeed.init_distributed(dist_backend="nccl")
        return torch.device("cuda", local_rank)
    deepspeed.init_distributed(dist_backend="gloo")
    dist.barrier()  # every rank has opened every rank's shared-memory buffer: the names can go (third_party)
    unlink_own_buffer(dist.get_rank())
    return torch.device("cpu")


def _train_step(engine, spec: RunSpec, step: int, grid, device: torch.device) -> float:
    """One optimizer step; returns the loss of the whole global batch (the mean over data-parallel ranks), the same
    at every layout that trains on that batch."""
    batches = step_batches(spec, step, grid.get_data_parallel_rank())
    if spec.pp > 1:
        return float(engine.train_batch(data_iter=iter(batches)))  # DeepSpeed averages it over the DP group
    total = torch.zeros((), dtype=torch.float64, device=device)
    for ids, labels in batches:
        loss = engine(ids.to(device), labels.to(device))
        engine.backward(loss)
        engine.step()
        total += loss.detach().double()
    if spec.dp > 1:
        dist.all_reduce(total, group=grid.get_data_parallel_group())
    return float(total) / (len(batches) * spec.dp)


def _digest_path(run_dir: Path, tag: str, rank: int) -> Path:
    return run_dir / "digests" / tag / f"rank-{rank:05d}.json"


def _save(args, engine, saver: async_save.Saver, step: int, rank: int, log: EventLog) -> None:
    tag = f"global_step{step}"
    start = time.perf_counter()
    digests = digest.state_digests(engine)  # state cannot change during the save: taken just before it
    path = _digest_path(args.run_dir, tag, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"tag": tag, "rank": rank, "combined": digest.combined(digests), "tensors": digests})
    log.emit("digest", tag=tag, seconds=time.perf_counter() - start, tensors=len(digests))
    _emit_save(log, saver.save(tag, step))


def _verify_full_state(reference: Path, tag: str, engine, model, spec: RunSpec, grid, log: EventLog) -> None:
    """A restart at another layout: every parameter's full fp32 master weights and Adam moments, gathered, against
    the digests taken from the original checkpoint's files (launch/reshard.py)."""
    start = time.perf_counter()
    restored = full_state.digests(engine, model, spec, grid)
    saved = json.loads(reference.read_text())["parameters"]
    diff = [f"{name}.{key}" for name, keys in sorted(restored.items()) for key, d in keys.items()
            if saved.get(name, {}).get(key) != d]
    log.emit("verify", tag=tag, ok=not diff, differing=diff[:50], differing_count=len(diff),
             tensors=sum(len(k) for k in restored.values()), seconds=time.perf_counter() - start, full_state=True)


def _verify(run_dir: Path, tag: str, engine, rank: int, log: EventLog) -> None:
    """Compare the restored state with the digest this rank recorded at save time."""
    start = time.perf_counter()
    restored = digest.state_digests(engine)
    path = _digest_path(run_dir, tag, rank)
    saved = json.loads(path.read_text())["tensors"] if path.is_file() else {}
    diff = digest.differences(saved, restored) if saved else ["<no digest recorded at save>"]
    log.emit("verify", tag=tag, ok=not diff, differing=diff[:50], differing_count=len(diff),
             tensors=len(restored), seconds=time.perf_counter() - start)
