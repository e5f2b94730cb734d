"""engine=fastpersist: DeepSpeed's FastPersist writer (`checkpoint.writer` type `fast`, decoupled=false): torch
serialization through DeepSpeed's async_io (libaio) op with pinned, double-buffered I/O. DeepSpeed creates the
engine from ds_config.json. On CPU, DeepSpeed 0.19.8 cannot run it (refused before launch, see check)."""

from __future__ import annotations

from restart_harness.errors import UsageError

SAVES = True
DECOUPLED = False
CPU_LIMITATION = ("DeepSpeed 0.19.8's FastCheckpointEngine needs a CUDA device: on its CPU accelerator it fails "
                  "on pin_memory() and on the UtilsBuilder op (not implemented for CPU), and its per-rank "
                  "NAME.pt-R.N files are not found by load_checkpoint")


def check(spec) -> None:
    if spec.device != "cuda":
        raise UsageError(f"engine={spec.engine} cannot run on device={spec.device}: {CPU_LIMITATION}; "
                         "use engine=default, torchsnapshot or dcp on CPU")


def ds_config(spec) -> dict:
    """DeepSpeed's checkpoint.writer block, from the engine options."""
    o = spec.engine_options
    return {"checkpoint": {"writer": {
        "type": "fast",
        "decoupled": DECOUPLED,
        "io_buffer_size": int(o["io_buffer_mib"]) * 2**20,
        "io_buffer_double": bool(o["io_buffer_double"]),
        "io_multiplier": int(o["io_multiplier"]),
        # Without a data_parallel unit DeepSpeed 0.19.8 crashes at initialize on pure data parallel.
        "data_parallel": o["data_parallel"],
        "show_statistics": bool(o["show_statistics"]),
    }}}


def make_checkpoint_engine(ds_engine, spec) -> None:
    """Keep the engine DeepSpeed built from checkpoint.writer (None), with its load fixed by the shim."""
    from third_party.deepspeed_writer_load import load_without_weights_only

    load_without_weights_only(ds_engine.checkpoint_engine)
