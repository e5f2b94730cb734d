"""engine=decoupled: DeepSpeed's FastPersist writer in a decoupled process per node (`checkpoint.writer`
decoupled=true); DeepSpeed commits it in the next engine.step(). CUDA only in DeepSpeed 0.19.8."""

from __future__ import annotations

from engines.fastpersist import FastPersistEngine
from restart_harness.errors import UsageError

CPU_LIMITATION = ("DeepSpeed 0.19.8's decoupled writer (DecoupledCheckpointEngine) needs a CUDA device: on its CPU "
                  "accelerator it fails on pin_memory() and on the UtilsBuilder op (not implemented for CPU)")


class DecoupledEngine(FastPersistEngine):
    name = "decoupled"
    description = "DeepSpeed FastPersist writer in a decoupled process, committed at the next step (CUDA only)"
    decoupled = True
    committed_by_deepspeed = True

    def check(self) -> None:
        if self.spec.device != "cuda":
            raise UsageError(f"engine=decoupled cannot run on device={self.spec.device}: {CPU_LIMITATION}; "
                             "its decoupled writer also fails on non-leaf tensors in ZeRO-1 state on CPU; "
                             "use engine=lazy, engine=torchsnapshot async_take=true or engine=dcp async_save=true on CPU")
