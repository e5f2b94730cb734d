"""DeepSpeed 0.19.8's real DecoupledCheckpointEngine on one CPU process whose writer process dies at once: on CPU its
FastCheckpointEngine cannot pin its I/O buffer (no accelerator), the failure engine=decoupled is refused on CPU for.
`python decoupled_writer_dies.py shim|plain` (with third_party/deepspeed_decoupled_cause.py installed, or not): prints the error the rank gets from commit, as one line `ERROR: ...`
(tests/test_engines.py). A script of its own: the writer process is spawned, and re-imports its parent's __main__."""

import os
import sys

if __name__ == "__main__":
    import deepspeed
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo
    from deepspeed.runtime.checkpoint_engine.decoupled_checkpoint_engine import DecoupledCheckpointEngine
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.model_checkpointing.data_parallel_writer_factory import DataParallelWriterConfig

    deepspeed.init_distributed("gloo")
    if sys.argv[1] == "shim":
        from third_party import deepspeed_decoupled_cause

        deepspeed_decoupled_cause.install()
    config = DeepSpeedConfig({"train_batch_size": 1, "checkpoint": {"writer": {
        "type": "fast", "decoupled": True, "data_parallel": "replica", "io_buffer_size": 1 << 20}}})
    engine = DecoupledCheckpointEngine(config, DataParallelWriterConfig(1, 0, 0, 0, True), False)
    engine.ckpt_process.join(300)  # dead before the commit asks: the error is the one a later step gets
    info = CheckpointCommitInfo(tag="global_step1", save_dir=os.getcwd(), save_latest=False)
    engine.create(info)
    try:
        engine.commit(info)
        print("ERROR: none")
    except RuntimeError as exc:
        print(f"ERROR: {exc}")
    engine.ckpt_process = None  # nothing left to clean up
    os._exit(0)
