"""engine=dcp: PyTorch Distributed Checkpoint, per DeepSpeed file without collectives (DCPFiles) or, with stack=fsdp2,
one collective save of the whole sharded state (DCPCollective), through the target's DCP storage layer; async_save
and what each writes: docs/engines.md#the-engines."""

from __future__ import annotations

from dataclasses import dataclass

from engines import _state_tree as state_tree
from engines.base import CheckpointIO, Engine, EngineContext
from restart_harness.spec.keys import key


@dataclass
class Options:
    async_save: bool = key(False, "dcp.async_save: return once staged in memory, write in a background thread",
                           group="checkpoint")


class DCPEngine(Engine):
    name = "dcp"
    description = "PyTorch Distributed Checkpoint per rank (a directory of .distcp shards per DeepSpeed file), no collectives"
    Options = Options
    stacks = ("deepspeed", "fsdp2")
    target_kinds = ("posix", "object")
    durable_on_wait = True  # FileSystemWriter(sync_files=True), its default: each file fsync'd before save returns

    def asynchronous(self) -> bool:
        return self.options.async_save

    def host_buffer_bytes(self, rank_bytes: int) -> int:
        return rank_bytes if self.options.async_save else 0  # async_save stages a copy of the state first

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return (DCPCollective if ctx.collective else DCPFiles)(self.options.async_save, ctx.target)


class _DCPIO(CheckpointIO):
    """dcp.save, or dcp.async_save (its futures waited for by wait()), through the target's storage writer."""

    def __init__(self, asynchronous: bool, target):
        self.asynchronous, self.target, self.futures = asynchronous, target, []

    def _save(self, state, path: str, **how) -> None:
        import torch.distributed.checkpoint as dcp

        writer = self.target.dcp_writer(path)
        if self.asynchronous:
            self.futures.append(dcp.async_save(state, storage_writer=writer, **how))
        else:
            dcp.save(state, storage_writer=writer, **how)

    def wait(self) -> None:
        futures, self.futures = self.futures, []
        for future in futures:
            future.result()


class DCPFiles(_DCPIO):
    """dcp.save / dcp.async_save of {tensors flat, skeleton} per file (engines/_state_tree.py); load rebuilds the
    tensors from the checkpoint's own .metadata."""

    def save(self, state, path):
        tensors, skeleton = state_tree.split(state)
        self._save({**tensors, state_tree.SKELETON_KEY: skeleton}, path, no_dist=True)
        return [path]

    def load(self, path, map_location=None, into=None):
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        # DCP loads in place: allocate each tensor from the checkpoint's own metadata first.
        metadata = self.target.dcp_reader(path).read_metadata()
        flat = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
                if isinstance(meta, TensorStorageMetadata) else None
                for key, meta in metadata.state_dict_metadata.items()}
        dcp.load(flat, no_dist=True, storage_reader=self.target.dcp_reader(path))
        skeleton = flat.pop(state_tree.SKELETON_KEY)
        return state_tree.merge(state_tree.relocate(flat, map_location), skeleton)

    def preserves_storage_sharing(self):
        return False  # DCP writes each view's own elements; no defensive clone needed


class DCPCollective(_DCPIO):
    """Collective dcp.save / dcp.async_save / dcp.load of a sharded state dict at a folder, on DCP's own gloo group:
    an async save plans and gathers in its background thread while training's collectives run on the default
    group, and two threads on one gloo group deadlock."""

    def __init__(self, asynchronous: bool, target):
        import torch.distributed as dist

        super().__init__(asynchronous, target)
        self.group = dist.new_group(backend="gloo")  # a collective: every rank opens its engine

    def save(self, state, path):
        """This rank's files: DCP's writer (one file per rank) names them __<rank>_0.distcp, and rank 0 (the
        coordinator) writes .metadata once every rank's plan is in."""
        import torch.distributed as dist

        self._save(state, path, process_group=self.group)
        rank = dist.get_rank()
        return [f"{path}/__{rank}_0.distcp"] + ([f"{path}/.metadata"] if rank == 0 else [])

    def load(self, path, map_location=None, into=None):
        import torch.distributed.checkpoint as dcp

        dcp.load(into, process_group=self.group, storage_reader=self.target.dcp_reader(path))
        return into
