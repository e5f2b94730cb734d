"""engine=torchsnapshot: each rank takes (and restores) its own torchsnapshot of each DeepSpeed state dict, at
DeepSpeed's path, which becomes a directory of shards instead of a .pt file. async_take=true returns once the
state is staged in memory and writes in torchsnapshot's background thread."""

from __future__ import annotations

import os
from dataclasses import dataclass

from engines.base import Engine
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

    def is_async(self) -> bool:
        return self.options.async_take

    def checkpoint_engine(self, ds_engine):
        # Each rank thinks it is alone (third_party shim) and would claim the whole host's memory: budget per rank.
        os.environ[MEMORY_BUDGET_ENV] = str(self.options.memory_budget_mib * 2**20)
        return _engine_class()(self.options.async_take)

    def wait_durable(self, checkpoint_engine) -> None:
        checkpoint_engine.wait()


def _engine_class():
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
    from torchsnapshot import Snapshot, StateDict

    from engines import _state_tree as state_tree
    from third_party.torchsnapshot_compat import async_private_copy, single_process

    class TorchSnapshotCheckpointEngine(CheckpointEngine):
        """One snapshot per save() call: tensors flat, the rest as one pickled skeleton (engines/_state_tree.py)."""

        def __init__(self, async_take: bool):
            super().__init__()
            self.name = "TorchSnapshotCheckpointEngine"
            self.async_take = async_take
            self.pending = []

        def create(self, info):
            return None

        def save(self, state_dict, path: str):
            tensors, skeleton = state_tree.split(state_dict)
            app_state = {"state": StateDict({**tensors, state_tree.SKELETON_KEY: skeleton})}
            with single_process():
                if self.async_take:
                    self.pending.append(Snapshot.async_take(path, app_state,
                                                            _custom_tensor_prepare_func=async_private_copy))
                else:
                    Snapshot.take(path, app_state)

        def wait(self) -> None:
            """Block until every pending async snapshot is written (metadata included)."""
            pending, self.pending = self.pending, []
            for snapshot in pending:
                snapshot.wait()

        def load(self, path: str, map_location=None):
            target = StateDict()
            with single_process():
                Snapshot(path).restore({"state": target})
            data = dict(target)
            skeleton = data.pop(state_tree.SKELETON_KEY)
            return state_tree.merge(state_tree.relocate(data, map_location), skeleton)

        def commit(self, info):
            return True  # durability is the harness's wait_durable + fsync, then its own commit of `latest`

        def preserves_storage_sharing(self):
            # torchsnapshot writes each view's own elements: DeepSpeed's defensive clone would only cost time.
            return False

    return TorchSnapshotCheckpointEngine
