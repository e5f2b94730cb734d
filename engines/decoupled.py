"""engine=decoupled: DeepSpeed's FastPersist writer in a spawned per-node process (`checkpoint.writer` type
`fast`, decoupled=true). save() queues the state dict; DeepSpeed commits (waits for the writer) in the next
engine.step(). On CPU, DeepSpeed 0.19.8 cannot run it (refused before launch, see check)."""

from __future__ import annotations

from engines import fastpersist
from restart_harness.errors import UsageError

SAVES = True


def check(spec) -> None:
    if spec.device != "cuda":
        raise UsageError(f"engine=decoupled cannot run on device={spec.device}: {fastpersist.CPU_LIMITATION}; "
                         "its decoupled writer also fails on non-leaf tensors in ZeRO-1 state on CPU; "
                         "use engine=torchsnapshot async_take=true or engine=dcp async_save=true on CPU")


def ds_config(spec) -> dict:
    config = fastpersist.ds_config(spec)
    config["checkpoint"]["writer"]["decoupled"] = True
    return config


make_checkpoint_engine = fastpersist.make_checkpoint_engine
