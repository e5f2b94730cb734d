"""engine=decoupled: DeepSpeed's FastPersist writer in a decoupled process per node (`checkpoint.writer`
decoupled=true); DeepSpeed commits it in the next engine.step(). CUDA only in DeepSpeed 0.19.8."""

from __future__ import annotations

from engines.base import CheckpointIO, EngineContext
from engines.fastpersist import FastPersistEngine, WriterIO
from restart_harness.errors import UsageError


class DecoupledEngine(FastPersistEngine):
    name = "decoupled"
    description = "DeepSpeed FastPersist writer in a decoupled process, committed at the next step (CUDA only)"
    decoupled = True
    committed_by_deepspeed = True

    def check(self) -> None:
        if self.spec.device != "cuda":
            raise UsageError(f"engine=decoupled cannot run on device={self.spec.device}: DeepSpeed 0.19.8's "
                             "DecoupledCheckpointEngine writes from a writer process it starts with spawn, which has "
                             "none of the CPU work-arounds engine=fastpersist runs with in the rank (its pinned buffer, "
                             "its UtilsBuilder; third_party/deepspeed_fastpersist_cpu.py); use "
                             "engine=fastpersist (the same writer, synchronous), engine=lazy, engine=torchsnapshot "
                             "async_take=true or engine=dcp async_save=true on CPU")

    def prepare(self) -> None:
        from third_party import deepspeed_decoupled_cause

        super().prepare()
        deepspeed_decoupled_cause.install()  # a dead writer process's error reaches the rank's

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return DecoupledIO(ctx.native, ctx.target, self.options.io_multiplier)


class DecoupledIO(WriterIO):
    """DeepSpeed's DecoupledCheckpointEngine: its writer process makes the file, named as the FastPersist writer
    names it (`X.pt-R.N` with ZeRO < 3); a rank without a writer process writes nothing."""

    def __init__(self, native, target, io_multiplier: int):
        super().__init__(native, target)
        self.io_multiplier = io_multiplier

    def save(self, state, path):
        from third_party.deepspeed_decoupled_cause import died
        from third_party.deepspeed_decoupled_grad import detached
        from third_party.deepspeed_fastpersist_cpu import replica_name

        if why := died(self.native):  # DeepSpeed's save would return as if written (its writer is gone)
            raise RuntimeError(why)
        self.native.save(detached(state), path)
        config = self.native.dp_writer_config
        if config is None:
            return []
        if not self.native.optimize_dp_state:
            return [path]
        return [replica_name(path, config.rank, config.world_size * self.io_multiplier)]
