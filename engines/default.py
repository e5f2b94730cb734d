"""engine=default: DeepSpeed's own TorchCheckpointEngine, as DeepSpeed builds it (one torch.save per file,
synchronous). The harness hands it the target's destination for each file: the path on a file system; on object
storage (ckpt_dir=s3://...) s3torchconnector's checkpoint stream, so the same torch.save and torch.load write and
read the object, which is complete, hence durable, when its multipart upload completes."""

from engines.base import Engine


class DefaultEngine(Engine):
    name = "default"
    description = "DeepSpeed TorchCheckpointEngine - torch.save of each state dict, synchronous"
    planned_names = True
    universal = True
    target_kinds = ("posix", "object")
