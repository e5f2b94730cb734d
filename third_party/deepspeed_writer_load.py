"""DeepSpeed 0.19.8: FastCheckpointEngine.load and DecoupledCheckpointEngine.load call torch.load(path) without
weights_only=False. Since torch 2.6 weights_only defaults to True, which refuses the Python objects DeepSpeed
pickles beside its tensors (the ds_config, client state), so a checkpoint saved with `checkpoint.writer` cannot
be loaded with the same config. load() reads exactly as DeepSpeed's TorchCheckpointEngine does. Remove when
`inspect.getsource(FastCheckpointEngine.load)` passes weights_only=False (or the engines delegate to torch_load).
"""

from __future__ import annotations

ADDRESSES = "deepspeed==0.19.8"


def load(path, map_location=None):
    """torch.load(..., weights_only=False): the files are DeepSpeed's own."""
    import torch

    return torch.load(path, map_location=map_location, weights_only=False)
