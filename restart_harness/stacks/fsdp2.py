"""stack=fsdp2: the same LLaMA model and data as the DeepSpeed runs, sharded with FSDP2 (fully_shard per pipeline
layer and at the root, over a 1-D mesh of the data-parallel ranks, or a 2-D one for hybrid sharding), trained with
torch's AdamW, checkpointed by one collective save of the whole sharded state per checkpoint (get_state_dict of model
and optimizer; engine=dcp), restarted through set_state_dict; verified on full tensors at any data-parallel size
(docs/fsdp2.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.rank_env import cuda_device, sync
from restart_harness.stacks.base import Rank, Stack, Verification, compare, write_digests

# The optimizer of the DeepSpeed runs (rundir/create.py build_ds_config): the same AdamW hyper-parameters and clipping.
BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0


def replicas(spec) -> int:
    """The replicas of hybrid sharding (1: plain FSDP over all data-parallel ranks); default one per node."""
    return spec.replicate or spec.nodes


class FSDP2Rank(Rank):
    def engine_context(self) -> dict:
        return {"collective": True}  # one collective save of the whole sharded state per checkpoint

    def start(self) -> None:
        """torch.distributed from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): NCCL on
        CUDA, gloo on CPU; no DeepSpeed communication layer at all."""
        import torch
        import torch.distributed as dist

        if self.spec.device == "cuda":
            self.device = torch.device("cuda", cuda_device())
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", device_id=self.device)
        else:
            dist.init_process_group("gloo")
            self.device = torch.device("cpu")

    def build(self) -> dict:
        """The model, its pipeline layers and then the root fully_shard-ed over all ranks (or, with replicate > 1,
        over each replica's ranks: hybrid sharding on a 2-D mesh), and AdamW over the shards."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from restart_harness.model.llama import LlamaForCausalLM, TPGroup

        spec, world, n = self.spec, dist.get_world_size(), replicas(self.spec)
        # HSDP (n > 1): shard within each replica group, replicate (all-reduce gradients) across them
        mesh_shape, names = ((n, world // n), ("replicate", "shard")) if n > 1 else ((world,), ("dp",))
        mesh = init_device_mesh(self.device.type, mesh_shape, mesh_dim_names=names)
        model = LlamaForCausalLM(spec.shape, TPGroup(), spec.seed).to(self.device)
        # fp32 parameters (the master weights, what the checkpoint holds); bf16 compute with fp32 gradient
        # reduction, as DeepSpeed's bf16 + ZeRO-1 runs
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if spec.precision == "bf16" else torch.float32,
                                  reduce_dtype=torch.float32)
        for child in model.children():
            fully_shard(child, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self.model, self.mesh = model, mesh
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=BETAS, eps=EPS,
                                           weight_decay=WEIGHT_DECAY)
        self.log.mark("model_built")
        sync(self.device)
        # the rank's place on the mesh: which replica it is in and which shard it holds (hybrid sharding)
        at = {f"{name}_rank": mesh.get_local_rank(name) for name in mesh.mesh_dim_names or ()}
        return {"dp_rank": self.rank, "tp_rank": 0, "pp_rank": 0, "device": str(self.device), "stack": "fsdp2",
                "local_parameters": sum(p.to_local().numel() for p in model.parameters()), **at}

    def hook(self, anatomy) -> None:
        import torch.distributed as dist

        self.anatomy = anatomy
        anatomy.hook_collectives(dist)

    def _state(self, step: int) -> dict:
        import torch
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state, "harness_step": torch.tensor(step, dtype=torch.int64)}

    def save(self, root, tag, step, io, untimed) -> dict:
        with self.anatomy.region("serialize"):
            state = self._state(step)
        os.makedirs(Path(root) / tag, exist_ok=True)
        io.save(state, str(Path(root) / tag))
        return {}

    def load(self, root, tag, io, untimed) -> dict:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        path = Path(root) / tag
        if not io.target.exists(path / ".metadata"):
            raise RuntimeError(f"no DCP checkpoint at {path} (no .metadata)")
        state = self._state(0)  # the shapes and shards to load into, at this run's data-parallel size ("other")
        io.load(str(path), into=state)
        with self.anatomy.region("copy"):
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        return {"harness_step": int(state["harness_step"])}

    def train_step(self, step: int) -> float:
        """One optimizer step over the global batch; its mean loss (the same samples as a DeepSpeed run's)."""
        import torch
        import torch.distributed as dist

        from restart_harness.model.llama import step_batches

        spec, model, device = self.spec, self.model, self.device
        batches = step_batches(spec, step, self.rank)
        total = torch.zeros((), dtype=torch.float64, device=device)
        for m, (ids, labels) in enumerate(batches):
            model.set_requires_gradient_sync(m == len(batches) - 1)  # reduce-scatter once, after the last micro-batch
            loss = model(ids.to(device), labels.to(device))
            (loss / len(batches)).backward()
            total += loss.detach().double()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(total)
        return float(total) / (len(batches) * spec.dp)

    def _state_digests(self) -> dict[str, str]:
        """name -> digest of the full tensor of every parameter and optimizer state, and the optimizer's
        param_groups; the same on every rank, whatever the number of ranks."""
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.tensor import DTensor

        from restart_harness.model import digest

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
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
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optim_state["param_groups"]]
        return {**{name: d for share in shares for name, d in share.items()}, "optim.param_groups": repr(groups)}

    def record_digests(self, tag: str) -> int:
        return write_digests(self, tag, self._state_digests())

    def verify(self, tag: str, reference: Path | None) -> Verification:
        """The full state against the digests rank 0 recorded at save (every rank recorded the same ones)."""
        start = time.perf_counter()
        return compare(self, tag, self._state_digests(), 0, start, full_state=True)


class FSDP2Stack(Stack):
    name = "fsdp2"
    key_text = "stack=fsdp2"
    description = ("torch FSDP2 (fully_shard over the data-parallel ranks; replicate=R: hybrid sharding) with "
                   "torch AdamW, checkpointed by one collective Distributed Checkpoint save")
    default_engine = "dcp"
    Rank = FSDP2Rank

    @classmethod
    def check(cls, spec, engine, target) -> None:
        """FSDP2 shards over the data-parallel ranks only; tensor and pipeline parallelism are DeepSpeed's here."""
        if spec.zero != 1:
            raise UsageError(f"zero={spec.zero}: ZeRO stages are DeepSpeed's; stack=fsdp2 shards parameters, gradients "
                             "and optimizer state over the data-parallel ranks by itself; accepted: stack=deepspeed")
        for name in ("tp", "pp"):
            if getattr(spec, name) != 1:
                raise UsageError(f"{name}={getattr(spec, name)}: stack=fsdp2 shards over data-parallel ranks only; "
                                 f"accepted: {name}=1 (tensor and pipeline parallelism: stack=deepspeed)")
        if spec.dp % replicas(spec):
            given = f"replicate={spec.replicate}" if spec.replicate else f"replicate (default nodes={spec.nodes})"
            raise UsageError(f"{given} does not divide dp={spec.dp}: each replica shards the state over dp / "
                             "replicate ranks; accepted: replicate dividing dp")

    @classmethod
    def check_relayout(cls, original, spec, engine, target, saves) -> None:
        """DCP reshards while it loads: any data-parallel size, nothing converted."""

    @classmethod
    def imports(cls, later: bool = False) -> None:
        import torch.distributed.checkpoint
        import torch.distributed.fsdp  # noqa: F401

        import restart_harness.model.llama  # noqa: F401

        super().imports(later)
