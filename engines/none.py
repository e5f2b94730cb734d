"""engine=none: train without checkpoints; the iteration-time baseline the others are compared with."""

from engines.base import Engine
from restart_harness.errors import UsageError


class NoCheckpoint(Engine):
    name = "none"
    description = "no checkpoint at all - the training-step baseline (no restart phase)"
    saves = False
    emulates = False
    stacks = ("deepspeed", "fsdp2")
    target_kinds = ("posix", "object")

    def check(self) -> None:
        if self.spec.phase == "restart":
            raise UsageError("engine=none writes no checkpoint, so there is nothing to restart from")
