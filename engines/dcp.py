"""engine=dcp: PyTorch Distributed Checkpoint.

stack=deepspeed: DCP writes each DeepSpeed state dict at DeepSpeed's path (a directory with .metadata and .distcp
shards). Every rank saves its own distinct state, so DCP runs with no_dist=True: no collectives, no cross-rank
planning.
stack=fsdp2: one collective dcp.save of the whole sharded state (get_state_dict of model and optimizer) per
checkpoint, DCP's own way: every rank writes __<rank>_0.distcp, rank 0 the global .metadata; loading reshards to
any number of ranks.
async_save=true returns once DCP has staged the state in memory; the files are written in a background thread.
To an s3:// ckpt_dir, the same calls with s3torchconnector's DCP storage writer and reader (same file names, as
objects)."""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import Engine
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
    s3 = True

    def is_async(self) -> bool:
        return self.options.async_save

    def checkpoint_engine(self, ds_engine):
        return _engine_class()(self.options.async_save, self.store)

    def fsdp2_checkpoint_engine(self):
        return _fsdp2_class()(self.options.async_save, self.store)

    def wait_durable(self, checkpoint_engine) -> None:
        checkpoint_engine.wait()


def _target(store, path: str, write: bool) -> dict:
    """dcp.save's (write) or dcp.load's target for `path`: DCP's own file system writer and reader, or
    s3torchconnector's for objects (their streams timed for the anatomy)."""
    if store is None:
        return {"checkpoint_id": path}
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter

    cls, name = (S3StorageWriter, "storage_writer") if write else (S3StorageReader, "storage_reader")
    target = cls(store.settings.region, str(store.url_of(path)), s3client_config=store.settings.client_config())
    store.timed_file_system(target.fs)
    return {name: target}


def _fsdp2_class():
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    class FSDP2DCP:
        """Collective dcp.save / dcp.async_save / dcp.load of a sharded state dict at a directory."""

        name = "FSDP2DCP"

        def __init__(self, async_save: bool, store=None):
            self.async_save = async_save
            self.store = store
            self.pending = []
            self.template: dict | None = None  # the state dict a load fills in place (set by the caller)
            # DCP's own group: an async save plans and gathers in its background thread while training's
            # collectives run on the default group; two threads on one gloo group deadlock.
            self.group = dist.new_group(backend="gloo")

        def save(self, state_dict, path: str) -> list[str]:
            """This rank's files: DCP's file system writer (one file per rank) names them __<rank>_0.distcp, and
            rank 0 (the coordinator) writes .metadata once every rank's plan is in."""
            if self.async_save:
                self.pending.append(dcp.async_save(state_dict, process_group=self.group,
                                                   **_target(self.store, path, write=True)))
            else:
                dcp.save(state_dict, process_group=self.group, **_target(self.store, path, write=True))
            if self.store is not None:
                self.store.placeholder(f"{path}/__{dist.get_rank()}_0.distcp")
                if dist.get_rank() == 0:  # the restart looks for it before loading
                    self.store.placeholder(f"{path}/.metadata")
            rank = dist.get_rank()
            return [f"{path}/__{rank}_0.distcp"] + ([f"{path}/.metadata"] if rank == 0 else [])

        def wait(self) -> None:
            pending, self.pending = self.pending, []
            for future in pending:
                future.result()

        def load(self, path: str, map_location=None):
            dcp.load(self.template, process_group=self.group, **_target(self.store, path, write=False))
            return self.template

        def is_decoupled(self) -> bool:
            return False

    return FSDP2DCP


def _engine_class():
    import torch
    import torch.distributed.checkpoint as dcp
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from engines import _state_tree as state_tree

    class DCPCheckpointEngine(CheckpointEngine):
        """dcp.save / dcp.async_save of {tensors flat, skeleton} per save() call; load rebuilds from .metadata."""

        def __init__(self, async_save: bool, store=None):
            super().__init__()
            self.name = "DCPCheckpointEngine"
            self.async_save = async_save
            self.store = store
            self.pending = []

        def create(self, info):
            return None

        def save(self, state_dict, path: str):
            tensors, skeleton = state_tree.split(state_dict)
            flat = {**tensors, state_tree.SKELETON_KEY: skeleton}
            if self.async_save:
                self.pending.append(dcp.async_save(flat, no_dist=True, **_target(self.store, path, write=True)))
            else:
                dcp.save(flat, no_dist=True, **_target(self.store, path, write=True))
            if self.store is not None:
                self.store.placeholder(path)

        def wait(self) -> None:
            """Block until every pending async save has written its files and metadata."""
            pending, self.pending = self.pending, []
            for future in pending:
                future.result()

        def load(self, path: str, map_location=None):
            # DCP loads in place: allocate each tensor from the checkpoint's own metadata first.
            reader = FileSystemReader(path) if self.store is None else _target(self.store, path, write=False)["storage_reader"]
            metadata = reader.read_metadata()
            target = {
                key: torch.empty(meta.size, dtype=meta.properties.dtype)
                if isinstance(meta, TensorStorageMetadata) else None
                for key, meta in metadata.state_dict_metadata.items()
            }
            dcp.load(target, no_dist=True, **_target(self.store, path, write=False))
            skeleton = target.pop(state_tree.SKELETON_KEY)
            return state_tree.merge(state_tree.relocate(target, map_location), skeleton)

        def commit(self, info):
            return True  # durability is the harness's wait_durable + fsync, then its own commit of `latest`

        def preserves_storage_sharing(self):
            return False  # DCP writes each view's own elements; no defensive clone needed

    return DCPCheckpointEngine
