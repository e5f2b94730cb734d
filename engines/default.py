"""engine=default: DeepSpeed's own TorchCheckpointEngine (one torch.save per file, synchronous)."""

from engines.base import Engine


class DefaultEngine(Engine):
    name = "default"
    description = "DeepSpeed TorchCheckpointEngine - torch.save of each state dict, synchronous"
    planned_names = True
    reshard = "universal"
