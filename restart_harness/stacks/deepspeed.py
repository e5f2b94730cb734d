"""stack=deepspeed: DeepSpeed ZeRO-1 training of the LLaMA model (restart_harness/model/) with tensor parallelism
(Megatron-style, through an mpu) and pipeline parallelism (PipelineModule), checkpointed by DeepSpeed's own
save_checkpoint / load_checkpoint. DeepSpeed calls its checkpoint engine per file; the harness installs one in its
place (DeepSpeedFiles) that hands each file to the rank's checkpoint manager, which times it and writes it through
the chosen engine (engines/). A restart at another layout converts the checkpoint with DeepSpeed's universal-checkpoint
converter, loads it with `checkpoint.load_universal` and verifies it against the full state of the original files
(stacks/_deepspeed_state.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.rank_env import cuda_device, sync
from restart_harness.stacks.base import Rank, Relayout, Stack, Verification, compare, write_digests

LOAD_UNIVERSAL = {"checkpoint": {"load_universal": True}}
# DeepSpeedFiles' lifecycle calls that go to DeepSpeed's own engine where there is one: what they return without
NATIVE_ONLY = {"create": None, "is_decoupled": False, "set_commit_info": None, "get_commit_info": None, "cleanup": None}


def client_state(spec, step: int) -> dict:
    """What every DeepSpeed checkpoint carries beside DeepSpeed's state: the step, and the universal-checkpoint
    information DeepSpeed's ds_to_universal needs to reshard it later (which parameters are row-parallel,
    TP-replicated, vocabulary-parallel; restart_harness/spec/parameters.py)."""
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    from restart_harness.spec.parameters import universal_checkpoint_patterns

    info = {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE,
            **universal_checkpoint_patterns(spec.shape)}
    return {"harness_step": step, UNIVERSAL_CHECKPOINT_INFO: info}


def ds_config_path(run) -> Path:
    """This launch's DeepSpeed config: a restart record's own (another layout), else the run's."""
    own = run.run_dir / "records" / f"ds_config-{run.record}.json"
    return own if run.record and own.is_file() else run.run_dir / "ds_config.json"


def init_distributed(spec):
    """DeepSpeed's process group: NCCL on CUDA, gloo on CPU (then every rank's shared-memory buffer name can go)."""
    import deepspeed
    import torch
    import torch.distributed as dist

    from third_party.deepspeed_shm_unlink import unlink_own_buffer

    if spec.device == "cuda":
        index = cuda_device()
        torch.cuda.set_device(index)
        deepspeed.init_distributed(dist_backend="nccl")
        return torch.device("cuda", index)
    deepspeed.init_distributed(dist_backend="gloo")
    dist.barrier()  # every rank has opened every rank's shared-memory buffer: the names can go (third_party)
    unlink_own_buffer(dist.get_rank())
    return torch.device("cpu")


class DeepSpeedRank(Rank):
    def start(self) -> None:
        self.device = init_distributed(self.spec)

    def build(self) -> dict:
        import deepspeed
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

        from restart_harness.model.llama import LlamaForCausalLM, TPGroup, pipeline_module

        spec = self.spec
        self.grid = grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(spec.pp, spec.tp, spec.dp))
        self.tp = TPGroup(grid.get_slice_parallel_group(), grid.get_slice_parallel_rank(), spec.tp)
        self.model = (pipeline_module(spec.shape, self.tp, spec.seed, grid._topo) if spec.pp > 1
                      else LlamaForCausalLM(spec.shape, self.tp, spec.seed))
        self.log.mark("model_built")
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        config = json.loads(ds_config_path(self.run).read_text())
        self.ds_engine, _, _, _ = deepspeed.initialize(model=self.model, model_parameters=self.params, config=config,
                                                    mpu=None if spec.pp > 1 else grid)
        sync(self.device)  # deepspeed.initialize's moves to the device are part of engine_init, not of what follows
        return {"dp_rank": grid.get_data_parallel_rank(), "tp_rank": self.tp.rank,
                "pp_rank": grid.get_pipe_parallel_rank(), "device": str(self.device),
                "local_parameters": sum(p.numel() for p in self.params)}

    def hook(self, anatomy) -> None:
        anatomy.wrap(self.ds_engine, "load_module_state_dict", "copy")
        if self.ds_engine.optimizer is not None:  # a universal load reads its files in here: those reads count as reads
            anatomy.wrap(self.ds_engine.optimizer, "load_state_dict", "copy", io=("read",))
        from deepspeed import comm

        anatomy.hook_collectives(comm)

    def engine_context(self) -> dict:
        return {"native": self.ds_engine.checkpoint_engine, "training": self.ds_engine}

    def attach(self, recorder) -> None:
        self.ds_engine.checkpoint_engine = DeepSpeedFiles(recorder)

    def save(self, root, tag, step, io, untimed) -> dict:
        self.ds_engine.save_checkpoint(str(root), tag=tag, client_state=client_state(self.spec, step),
                                       save_latest=False)
        return {"universal_info": True}  # client_state() carried it: ds_to_universal can convert this checkpoint

    def load(self, root, tag, io, untimed) -> dict:
        path, client = self.ds_engine.load_checkpoint(str(root), tag=tag)
        if path is None:
            raise RuntimeError(f"DeepSpeed load_checkpoint found no checkpoint for tag {tag!r} in {root}")
        return client or {}

    def commit_pending(self) -> None:
        self.ds_engine._commit_decoupled_checkpoint()

    def train_step(self, step: int) -> float:
        """One optimizer step; the loss of the whole global batch (the mean over data-parallel ranks), the same at
        every layout that trains on that batch."""
        import torch
        import torch.distributed as dist

        from restart_harness.model.llama import step_batches

        spec, device = self.spec, self.device
        batches = step_batches(spec, step, self.grid.get_data_parallel_rank())
        if spec.pp > 1:
            return float(self.ds_engine.train_batch(data_iter=iter(batches)))  # DeepSpeed averages it over the DP group
        total = torch.zeros((), dtype=torch.float64, device=device)
        for ids, labels in batches:
            loss = self.ds_engine(ids.to(device), labels.to(device))
            self.ds_engine.backward(loss)
            self.ds_engine.step()
            total += loss.detach().double()
        if spec.dp > 1:
            dist.all_reduce(total, group=self.grid.get_data_parallel_group())
        return float(total) / (len(batches) * spec.dp)

    def record_digests(self, tag: str) -> int:
        from restart_harness.stacks._deepspeed_state import state_digests

        return write_digests(self, tag, state_digests(self.ds_engine))  # just before the save: the state cannot change

    def verify(self, tag: str, reference: Path | None) -> Verification:
        from restart_harness.stacks import _deepspeed_state as state

        start = time.perf_counter()
        if reference is None:
            return compare(self, tag, state.state_digests(self.ds_engine), self.rank, start)
        # another layout: every parameter's full fp32 master weights and Adam moments, gathered, against the digests
        # taken from the original checkpoint's files
        restored = state.full_state_digests(self.ds_engine, self.model, self.spec, self.grid)
        saved = json.loads(Path(reference).read_text())["parameters"]
        diff = [f"{name}.{key}" for name, keys in sorted(restored.items()) for key, d in keys.items()
                if saved.get(name, {}).get(key) != d]
        return Verification(tag, not diff, diff, sum(len(k) for k in restored.values()), time.perf_counter() - start,
                            full_state=True)


class DeepSpeedStack(Stack):
    name = "deepspeed"
    key_text = "stack=deepspeed"
    description = "DeepSpeed ZeRO (stage 1, 2 or 3) with tensor (Megatron-style) and pipeline (PipelineModule) parallelism"
    default_engine = "default"
    planned = True
    Rank = DeepSpeedRank

    @classmethod
    def check(cls, spec, engine, target) -> None:
        if spec.replicate is not None:
            raise UsageError(f"replicate={spec.replicate}: hybrid sharding is stack=fsdp2's; DeepSpeed's ZeRO "
                             "shards over every data-parallel rank; accepted: stack=fsdp2")
        if spec.zero > 1 and spec.pp > 1:
            raise UsageError(f"zero={spec.zero} with pp={spec.pp}: DeepSpeed 0.19.8's pipeline engine takes ZeRO stage "
                             "1 only (PipelineEngine asserts it); accepted: zero=1 with pp > 1, or pp=1")

    @classmethod
    def check_relayout(cls, original, spec, engine, target, saves) -> None:
        change = f"{original.layout} -> {spec.layout}"
        if target.kind != "posix":
            raise UsageError(f"restart at another layout ({change}): DeepSpeed's universal-checkpoint converter reads "
                             f"a file system, and this checkpoint is on storage target {target.name}; accepted: a "
                             "restart at its own layout (stack=fsdp2 runs reshard from object storage)")
        if not engine.universal:
            raise UsageError(f"restart at another layout ({change}): engine={engine.name} writes its own format, "
                             "which DeepSpeed's universal-checkpoint converter cannot read; accepted: engine=default "
                             "runs")
        if not saves or not all(s.get("universal_info") for s in saves):
            raise UsageError(f"restart at another layout ({change}): the checkpoint was written without the "
                             "universal-checkpoint information DeepSpeed's converter needs (a run of an older "
                             "harness); restart it at its own layout")

    @classmethod
    def relayout(cls, run, original, tag: str, say) -> Relayout:
        from restart_harness.stacks import _deepspeed_state as state

        root = run.checkpoint_root
        conversion = state.convert(run.run_dir, root, tag, say)
        reference = state.reference(run.run_dir, root, tag, original)
        converted = state.universal_tag(tag)
        return Relayout(load_tag=converted, reference=reference, conversion=conversion, ds_config=LOAD_UNIVERSAL,
                        load_dir=root / converted)

    @classmethod
    def imports(cls, later: bool = False) -> None:
        import deepspeed
        import deepspeed.runtime.pipe.topology

        import restart_harness.model.llama  # noqa: F401

        super().imports(later)
        if later:  # deepspeed.initialize's ZeRO check imports DeepSpeed's Muon optimizer, whose torch.compile
            # decorators import torch._inductor: about 2 s of a rank's engine_init here (DeepSpeed 0.19.8)
            import deepspeed.runtime.engine
            import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401


class DeepSpeedFiles:
    """What DeepSpeed calls as its checkpoint engine (DeepSpeed duck-types it): each file it saves or loads goes to
    the rank's checkpoint manager (its recorder, which writes through the chosen engine); DeepSpeed's own
    lifecycle calls (create, commit, decoupled commits) go to the engine DeepSpeed built where the chosen engine is
    that one (io.native), and are no-ops otherwise: the harness makes saves durable and commits `latest` itself."""

    def __init__(self, recorder):
        self.recorder, self.native = recorder, recorder.native
        self.name = f"Harness({getattr(self.native, 'name', None) or type(recorder.io).__name__})"
        self.committed = recorder.committed  # set when DeepSpeed commits a decoupled engine's checkpoint

    def save(self, state_dict, path: str):
        return self.recorder.save(state_dict, path)

    def load(self, path: str, map_location=None):
        return self.recorder.load(path, map_location=map_location)

    def makedirs(self, path, exist_ok=False):
        os.makedirs(path, exist_ok=exist_ok)

    def commit(self, info):
        result = self.native.commit(info) if self.native is not None else True
        self.committed.set()
        return result

    def is_data_parallel_writer(self, dp_rank):
        return self.recorder.io.is_data_parallel_writer(dp_rank)

    def preserves_storage_sharing(self):
        return self.recorder.io.preserves_storage_sharing()

    def __getattr__(self, name):
        """create, is_decoupled, set_commit_info, get_commit_info, cleanup: the native engine's, else no-ops."""
        if name not in NATIVE_ONLY:
            raise AttributeError(name)
        return getattr(self.native, name) if self.native is not None else lambda *args: NATIVE_ONLY[name]
