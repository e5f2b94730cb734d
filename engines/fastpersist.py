"""engine=fastpersist: DeepSpeed's FastPersist writer (`checkpoint.writer` type `fast`, decoupled=false): torch
serialization through DeepSpeed's async_io (libaio) op with pinned, double-buffered I/O. DeepSpeed creates the
engine from ds_config.json; the harness saves and loads through it (its load with the third_party fix). On CPU,
DeepSpeed 0.19.8 cannot run it (refused before launch, see check)."""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import CheckpointIO, Engine, EngineContext, NativeIO
from restart_harness.errors import UsageError
from restart_harness.spec.keys import key

CPU_LIMITATION = ("DeepSpeed 0.19.8's FastCheckpointEngine needs a CUDA device: on its CPU accelerator it fails "
                  "on pin_memory() and on the UtilsBuilder op (not implemented for CPU), and its per-rank "
                  "NAME.pt-R.N files are not found by load_checkpoint")


@dataclass
class Options:
    io_buffer_mib: int = key(64, "checkpoint.writer.io_buffer_size", group="checkpoint", unit="MiB", minimum=1)
    io_buffer_double: bool = key(True, "double buffering", group="checkpoint")
    io_multiplier: int = key(1, "checkpoint.writer.io_multiplier", group="checkpoint", minimum=1)
    data_parallel: str = key("replica", "which data-parallel ranks write", group="checkpoint",
                             choices=("replica", "socket", "machine"))
    show_statistics: bool = key(False, "DeepSpeed prints the writer's statistics", group="checkpoint")


class FastPersistEngine(Engine):
    name = "fastpersist"
    description = "DeepSpeed FastPersist writer (checkpoint.writer type fast) - libaio, pinned double buffers (CUDA only)"
    Options = Options
    emulates = False  # DeepSpeed builds the engine from its config inside deepspeed.initialize
    decoupled = False

    def asynchronous(self) -> bool:
        return self.decoupled

    def check(self) -> None:
        if self.spec.device != "cuda":
            raise UsageError(f"engine={self.name} cannot run on device={self.spec.device}: {CPU_LIMITATION}; "
                             "use engine=default, torchsnapshot, dcp or lazy on CPU")

    def ds_config(self) -> dict:
        """DeepSpeed's checkpoint.writer block, from the options."""
        o = self.options
        return {"checkpoint": {"writer": {
            "type": "fast",
            "decoupled": self.decoupled,
            "io_buffer_size": o.io_buffer_mib * 2**20,
            "io_buffer_double": o.io_buffer_double,
            "io_multiplier": o.io_multiplier,
            # Without a data_parallel unit DeepSpeed 0.19.8 crashes at initialize on pure data parallel.
            "data_parallel": o.data_parallel,
            "show_statistics": o.show_statistics,
        }}}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return WriterIO(ctx.native, ctx.target)


class WriterIO(NativeIO):
    """The engine DeepSpeed built from checkpoint.writer, its load fixed by third_party/deepspeed_writer_load.py."""

    def load(self, path, map_location=None, into=None):
        from third_party.deepspeed_writer_load import load

        return load(path, map_location)
