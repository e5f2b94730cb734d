"""One rank of stack=fsdp2: the same LLaMA model and data as the DeepSpeed runs, sharded with FSDP2
(torch.distributed.fsdp.fully_shard per pipeline layer and at the root, over a 1-D mesh of the data-parallel ranks),
trained with torch's AdamW, checkpointed through the engine's collective DCP calls, restarted and verified.

It drives the harness's own save path unchanged (worker/checkpointing.py, worker/async_save.py): FSDP2Engine below
offers DeepSpeed's save_checkpoint / load_checkpoint signature over get_state_dict / set_state_dict, so blocking,
durable and committed seconds, the files, the anatomy and the events are the same records as a DeepSpeed run's.

Verification holds at any data-parallel size: state_digests() digests every parameter's and optimizer moment's full
tensor (DTensor.full_tensor(); digest.tensor_digest), each rank hashing its share of the names, so a restart at
another dp compares the same names and values as one at the saving dp.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from restart_harness.spec.runspec import RunSpec
from restart_harness.storage.atomic import write_json_atomic
from restart_harness.worker import async_save, checkpointing, digest, faults
from restart_harness.worker.anatomy import Anatomy
from restart_harness.worker.data import step_batches
from restart_harness.worker.events import EventLog
from restart_harness.worker.model import LlamaForCausalLM
from restart_harness.worker.tensor_parallel import TPGroup

# The optimizer of the DeepSpeed runs (generate/ds_config.py): the same AdamW hyper-parameters and clipping.
BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0


class FSDP2Engine:
    """The save/load face the harness's checkpointing code drives (DeepSpeed's names), for an FSDP2 model."""

    def __init__(self, module, optimizer, checkpoint_engine, anatomy: Anatomy):
        self.module, self.optimizer = module, optimizer
        self.checkpoint_engine = checkpoint_engine  # checkpointing.RecordingEngine around the engine's FSDP2 object
        self.anatomy = anatomy

    def _state(self, step: int) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        return {"model": model_state, "optim": optim_state, "harness_step": torch.tensor(step, dtype=torch.int64)}

    def save_checkpoint(self, root: str, tag: str, client_state: dict, save_latest: bool = False) -> None:
        with self.anatomy.region("serialize"):
            state = self._state(int(client_state["harness_step"]))
        os.makedirs(Path(root) / tag, exist_ok=True)
        self.checkpoint_engine.save(state, str(Path(root) / tag))

    def load_checkpoint(self, root: str, tag: str) -> tuple[str, dict]:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        path = Path(root) / tag
        if not (path / ".metadata").is_file():
            return None, {}
        state = self._state(0)  # the shapes and shards to load into, at this run's data-parallel size ("other")
        self.checkpoint_engine.inner.template = state
        self.checkpoint_engine.load(str(path))
        with self.anatomy.region("copy"):
            set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        return str(path), {"harness_step": int(state["harness_step"])}


def run(args, log: EventLog, rank: int, spec: RunSpec, plugin, peak_memory) -> None:
    device = _init_distributed(spec)
    log.mark("dist_init_done")
    world = dist.get_world_size()
    model, optimizer = build(spec, device, world)
    log.mark("model_built")
    anatomy = Anatomy(device.type, enabled=spec.anatomy)
    anatomy.add_prefix(args.ckpt_root)
    anatomy.hook_collectives(dist)
    if plugin.store is not None:
        plugin.store.region = anatomy.region
    inner = plugin.fsdp2_checkpoint_engine() if plugin.saves else None
    recorder = checkpointing.RecordingEngine(inner, anatomy) if inner is not None else None
    engine = FSDP2Engine(model, optimizer, recorder, anatomy)
    log.emit("layout", dp_rank=rank, tp_rank=0, pp_rank=0, device=str(device), stack="fsdp2",
             local_parameters=sum(p.to_local().numel() for p in model.parameters()))

    first, last = 1, spec.iters
    _sync(device)
    if args.phase != "restart":
        log.mark("engine_initialized")
    else:
        tag, client_state = checkpointing.measured_load(engine, recorder, args.ckpt_root, args.load_tag, log,
                                                        peak_memory, lambda: _sync(device))
        _verify(args.run_dir, tag, model, optimizer, log)
        first = int(client_state["harness_step"]) + 1
        last = first + spec.after - 1

    saves = plugin.saves and args.phase == "checkpoint"
    saver = None
    if recorder is not None:
        saver = async_save.Saver(engine, recorder, plugin, args.ckpt_root, rank, dist.barrier,
                                 lambda flag: _all_true(flag, device))
    for step in range(first, last + 1):
        faults.hit("step", rank, step, where=str(args.ckpt_root))
        start = time.perf_counter()
        loss = train_step(model, optimizer, spec, step, rank, device)
        seconds = time.perf_counter() - start
        log.emit("step", step=step, loss=loss, seconds=seconds, last=last,
                 in_flight=saver.overlapped(start) if saver else False)
        if step == first and args.phase == "restart":
            log.mark("first_step_done")
        if saver is None:
            continue
        _emit_save(log, saver.poll())
        if saves and step % spec.save_interval == 0:
            _emit_save(log, saver.finish())
            _save(args, engine, saver, step, rank, log)
    if saver is not None:
        _emit_save(log, saver.finish())
    dist.barrier()
    log.mark("finished")


def build(spec: RunSpec, device: torch.device, world: int):
    """The model, its pipeline layers and then the root fully_shard-ed over all ranks (or, with replicate > 1, over
    each replica's ranks: hybrid sharding on a 2-D mesh), and AdamW over the shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    replicas = spec.replicas
    if replicas > 1:  # HSDP: shard within each replica group, replicate (all-reduce gradients) across them
        mesh = init_device_mesh(device.type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    model = LlamaForCausalLM(spec.shape, TPGroup(), spec.seed).to(device)
    # fp32 parameters (the master weights, what the checkpoint holds); bf16 compute with fp32 gradient reduction,
    # as DeepSpeed's bf16 + ZeRO-1 runs
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if spec.precision == "bf16" else torch.float32,
                              reduce_dtype=torch.float32)
    for child in model.children():
        fully_shard(child, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    return model, optimizer


def train_step(model, optimizer, spec: RunSpec, step: int, dp_rank: int, device: torch.device) -> float:
    """One optimizer step over the global batch; returns its mean loss (the same samples as a DeepSpeed run's)."""
    batches = step_batches(spec, step, dp_rank)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for m, (ids, labels) in enumerate(batches):
        model.set_requires_gradient_sync(m == len(batches) - 1)  # reduce-scatter once, after the last micro-batch
        loss = model(ids.to(device), labels.to(device))
        (loss / len(batches)).backward()
        total += loss.detach().double()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(total)
    return float(total) / (len(batches) * spec.dp)


def state_digests(model, optimizer) -> dict[str, str]:
    """name -> digest of the full tensor of every parameter and optimizer state, and the optimizer's param_groups;
    the same on every rank, whatever the number of ranks."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    model_state, optim_state = get_state_dict(model, optimizer)
    tensors = {f"model.{k}": v for k, v in model_state.items()}
    for fqn, state in optim_state["state"].items():
        tensors.update({f"optim.{fqn}.{k}": v for k, v in state.items()})
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {}
    for i, name in enumerate(sorted(tensors)):
        value = tensors[name]
        full = value.full_tensor() if isinstance(value, DTensor) else value  # a collective: every rank takes part
        if i % world == rank:
            mine[name] = digest.tensor_digest(full) if isinstance(full, torch.Tensor) else repr(full)
    shares: list = [None] * world
    dist.all_gather_object(shares, mine)
    out = {name: d for share in shares for name, d in share.items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optim_state["param_groups"]]
    out["optim.param_groups"] = repr(groups)
    return out


def _digest_path(run_dir: Path, tag: str, rank: int) -> Path:
    return run_dir / "digests" / tag / f"rank-{rank:05d}.json"


def _save(args, engine: FSDP2Engine, saver, step: int, rank: int, log: EventLog) -> None:
    tag = f"global_step{step}"
    start = time.perf_counter()
    digests = state_digests(engine.module, engine.optimizer)
    path = _digest_path(args.run_dir, tag, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"tag": tag, "rank": rank, "combined": digest.combined(digests), "tensors": digests})
    log.emit("digest", tag=tag, seconds=time.perf_counter() - start, tensors=len(digests))
    _emit_save(log, saver.save(tag, step))


def _verify(run_dir: Path, tag: str, model, optimizer, log: EventLog) -> None:
    """The full state against the digests rank 0 recorded at save time (every rank recorded the same ones)."""
    start = time.perf_counter()
    restored = state_digests(model, optimizer)
    path = _digest_path(run_dir, tag, 0)
    saved = json.loads(path.read_text())["tensors"] if path.is_file() else {}
    diff = digest.differences(saved, restored) if saved else ["<no digest recorded at save>"]
    log.emit("verify", tag=tag, ok=not diff, differing=diff[:50], differing_count=len(diff), tensors=len(restored),
             seconds=time.perf_counter() - start, full_state=True)


def _emit_save(log: EventLog, record: dict | None) -> None:
    if record is not None:
        record.pop("universal_info", None)  # DeepSpeed's converter never reads these checkpoints
        log.emit("save", **record)


def _all_true(flag: bool, device: torch.device) -> bool:
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _init_distributed(spec: RunSpec) -> torch.device:
    """torch.distributed from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): NCCL on
    CUDA, gloo on CPU; no DeepSpeed communication layer at all."""
    if spec.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")
