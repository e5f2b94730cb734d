"""Split a DeepSpeed state dict into its tensors and the rest, and put it back together exactly.

DeepSpeed's state dicts mix tensors with Python objects (the ds_config dict, ints, strings, OrderedDicts,
dataclass slice mappings). Tensor-oriented writers (torchsnapshot, DCP) flatten containers their own way and
hand back plain dicts and lists. So the sharded engines write the tensors under flat keys and the rest, with a
TensorSlot where each tensor was, as one pickled skeleton: load returns the same types, keys and order.
torch is imported by the functions that need it: engine modules import this one when the command line reads them.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SKELETON_KEY = "skeleton"


@dataclass(frozen=True)
class TensorSlot:
    """Where a tensor sat in the state dict; key names it in the flat tensor mapping."""

    key: str


def _walk(obj: object, leaf) -> object:
    """obj rebuilt with leaf(x) for every x in it that is not a Mapping or a plain list or tuple (type(obj)(...)
    keeps OrderedDict and friends; insertion order is kept either way)."""
    if isinstance(obj, Mapping):
        return type(obj)((k, _walk(v, leaf)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_walk(v, leaf) for v in obj)
    return leaf(obj)


def split(state: object) -> tuple[dict[str, Any], bytes]:
    """(flat tensors 't0', 't1', ..., pickled skeleton) of a nested state dict."""
    import torch

    tensors: dict[str, torch.Tensor] = {}

    def slot(obj: object) -> object:
        if isinstance(obj, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = obj.detach()  # writers read the data; autograd history is not state
            return TensorSlot(key)
        return obj  # any other object is pickled whole (no tensors hide in DeepSpeed's)

    return tensors, pickle.dumps(_walk(state, slot), protocol=pickle.HIGHEST_PROTOCOL)


def merge(tensors: Mapping[str, Any], skeleton: bytes) -> object:
    """The state dict split() took apart, with the restored tensors in their slots."""
    # The skeleton is the harness's own file, written by split() above, never downloaded data.
    return _walk(pickle.loads(skeleton), lambda obj: tensors[obj.key] if isinstance(obj, TensorSlot) else obj)


def relocate(tensors: dict[str, Any], map_location: object) -> dict[str, Any]:
    """torch.load's map_location for tensors read onto the CPU: a device (or its name), or a callable
    (storage, 'cpu') -> storage as DeepSpeed passes; a dict remap keeps them where they were read."""
    import torch

    if map_location is None or isinstance(map_location, dict):
        return tensors
    if callable(map_location):
        out = {}
        for key, t in tensors.items():
            storage = map_location(t.untyped_storage(), "cpu")  # as torch.load would call it
            out[key] = torch.empty(0, dtype=t.dtype, device=storage.device).set_(
                storage, t.storage_offset(), t.size(), t.stride())
        return out
    return {key: t.to(map_location) for key, t in tensors.items()}
