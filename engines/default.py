"""engine=default: DeepSpeed's own TorchCheckpointEngine, as DeepSpeed builds it (one torch.save per file,
synchronous). The harness hands it the target's destination for each file: the path on a file system; on object
storage (ckpt_dir=s3://...) s3torchconnector's checkpoint stream, so the same torch.save and torch.load write and
read the object, which is complete, hence durable, when its multipart upload completes. And engine=none: train
without checkpoints; the iteration-time baseline the others are compared with."""

from engines.base import Engine
from restart_harness.errors import UsageError


class DefaultEngine(Engine):
    name = "default"
    description = "DeepSpeed TorchCheckpointEngine - torch.save of each state dict, synchronous"
    planned_names = True
    universal = True
    target_kinds = ("posix", "object")


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
