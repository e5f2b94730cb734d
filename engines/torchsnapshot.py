"""engine=torchsnapshot: each rank takes (and restores) its own torchsnapshot of each DeepSpeed state dict, at
DeepSpeed's path, which becomes a folder of shards instead of a .pt file. async_take=true returns once the state is
staged in memory and writes in torchsnapshot's background thread."""

from __future__ import annotations

import os
from dataclasses import dataclass

from engines import _state_tree as state_tree
from engines.base import CheckpointIO, Engine, EngineContext
from restart_harness.spec.keys import key

MEMORY_BUDGET_ENV = "TORCHSNAPSHOT_PER_RANK_MEMORY_BUDGET_BYTES"


@dataclass
class Options:
    async_take: bool = key(False, "Snapshot.async_take: return once staged in memory, write in the background",
                           group="checkpoint")
    memory_budget_mib: int = key(2048, "staging memory per rank (TORCHSNAPSHOT_PER_RANK_MEMORY_BUDGET_BYTES)",
                                 group="checkpoint", unit="MiB", minimum=1)


class TorchSnapshotEngine(Engine):
    name = "torchsnapshot"
    description = "torchsnapshot per rank (a directory of shards per DeepSpeed file), no cross-rank de-duplication"
    Options = Options

    def asynchronous(self) -> bool:
        return self.options.async_take

    def host_buffer_bytes(self, rank_bytes: int) -> int:
        # async_take stages the whole state before it returns; else up to the budget at a time (each rank its own)
        return rank_bytes if self.options.async_take else min(rank_bytes, self.options.memory_budget_mib << 20)

    def open(self, ctx: EngineContext) -> CheckpointIO:
        # Each rank thinks it is alone (third_party shim) and would claim the whole host's memory: budget per rank.
        os.environ[MEMORY_BUDGET_ENV] = str(self.options.memory_budget_mib * 2**20)
        return TorchSnapshotIO(self.options.async_take)


class TorchSnapshotIO(CheckpointIO):
    """One snapshot per file: tensors flat, the rest as one pickled skeleton (engines/_state_tree.py)."""

    def __init__(self, async_take: bool):
        self.async_take, self.pending = async_take, []

    def save(self, state, path):
        from torchsnapshot import Snapshot, StateDict

        from third_party.torchsnapshot_compat import async_private_copy, single_process

        tensors, skeleton = state_tree.split(state)
        app_state = {"state": StateDict({**tensors, state_tree.SKELETON_KEY: skeleton})}
        with single_process():
            if self.async_take:
                self.pending.append(Snapshot.async_take(path, app_state,
                                                        _custom_tensor_prepare_func=async_private_copy))
            else:
                Snapshot.take(path, app_state)
        return [path]

    def wait(self) -> None:
        """Until every pending async snapshot is written (metadata included)."""
        pending, self.pending = self.pending, []
        for snapshot in pending:
            snapshot.wait()

    def load(self, path, map_location=None, into=None):
        from torchsnapshot import Snapshot, StateDict

        from third_party.torchsnapshot_compat import single_process

        restored = StateDict()
        with single_process():
            Snapshot(path).restore({"state": restored})
        data = dict(restored)
        skeleton = data.pop(state_tree.SKELETON_KEY)
        return state_tree.merge(state_tree.relocate(data, map_location), skeleton)

    def preserves_storage_sharing(self):
        # torchsnapshot writes each view's own elements: DeepSpeed's defensive clone would only cost time.
        return False
