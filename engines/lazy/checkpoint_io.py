"""engine=lazy's CheckpointIO: a rank's saves (save.py) and loads (load.py), and the DeepSpeed internals it patches,
each named where it is patched (patch_deepspeed)."""

from __future__ import annotations

from engines.base import CheckpointIO
from engines.lazy import Options
from engines.lazy.load import Loader
from engines.lazy.save import Saver


class LazyIO(CheckpointIO):
    def __init__(self, options: Options, ds_engine, storage: dict | None = None):
        """ds_engine: DeepSpeed's engine (None: the format alone, as in tests: no step to wait in); storage: the
        run's storage probe (files/baseline.py), which the policies go by."""
        import torch.distributed as dist

        self.options, self.ds_engine = options, ds_engine
        # this rank's data-parallel index, the group's size, the group (DeepSpeed's optimizer's; None alone)
        group = getattr(getattr(ds_engine, "optimizer", None), "dp_process_group", None)
        alone = group is None or not dist.is_initialized()
        data_parallel = (0, 1, group) if alone else (dist.get_rank(group=group), dist.get_world_size(group=group), group)
        self.dp_rank, self.dp_size, self.dp_group = data_parallel
        self.saver = Saver(options, storage, ds_engine, self.dp_rank, self.dp_size)
        self.loader = Loader(options, storage, ds_engine, data_parallel)
        # the save's (statistics: since the last call, stats.SaveStats) and the load's, as they are
        self.wait_copied, self.wait, self.buffers = self.saver.wait_copied, self.saver.wait, self.saver.buffers
        self.statistics, self.load_statistics = self.saver.statistics, self.loader.statistics
        if ds_engine is not None:
            self.patch_deepspeed(ds_engine)

    def patch_deepspeed(self, ds_engine) -> None:
        """DeepSpeed's engine, patched twice: save_non_zero_checkpoint (every replica is handed the replicated files,
        to write its share of them), and _take_model_step, wrapped (the optimizer step waits for the copies of the
        saves before it, and, until the first save, marks its time for staging=auto). A third internal is called,
        not patched: _get_zero_ckpt_name (load.py), to name the rank's own ZeRO file to read ahead."""
        if self.options.balance and self.dp_size > 1:
            ds_engine.save_non_zero_checkpoint = True
        step = ds_engine._take_model_step

        def take_model_step(*args, **kwargs):
            if not self.saver.plans:  # the optimizer step's interval, until the first save
                self.saver.staging.mark_step()
            self.saver.wait_copied()  # nothing may change the state while it is being copied
            return step(*args, **kwargs)

        ds_engine._take_model_step = take_model_step

    def save(self, state, path):
        self.loader.last_read.clear()
        return self.saver.save(state, path)

    def load(self, path, map_location=None, into=None):
        return self.loader.load(path, map_location)

    def preserves_storage_sharing(self):
        return False  # each view's own elements are copied: no defensive clone needed

    def is_data_parallel_writer(self, dp_rank):
        return dp_rank == 0 or (self.options.balance and self.dp_size > 1)

