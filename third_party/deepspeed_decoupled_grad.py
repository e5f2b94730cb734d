"""DeepSpeed 0.19.8's DecoupledCheckpointEngine.save puts the state dict it is given on a torch.multiprocessing
queue for its writer process. The ZeRO stage 1-2 state holds the optimizer's `single_partition_of_fp32_groups`,
slices of a flat fp32 buffer that require grad, and torch's reduce_tensor refuses to send a non-leaf tensor that
requires grad to another process ("Cowardly refusing to serialize non-leaf tensor which requires_grad"): every
engine=decoupled save failed, on an H200 too (2026-11-26). detached() hands the engine the same state with such
tensors detached: the same storage (nothing is copied), without the autograd link a checkpoint never holds.
Remove when tests/test_engines.py::test_deepspeed_decoupled_shim_still_needed fails (DeepSpeed detaches itself).
"""

from __future__ import annotations

from collections.abc import Mapping

ADDRESSES = "deepspeed==0.19.8"


def detached(state: object) -> object:
    """state with every tensor that requires grad replaced by its detach(). A container holding none is returned as
    it is; one rebuilt keeps its type and a state dict's `_metadata` (the module versions load_state_dict reads)."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.detach() if state.requires_grad else state
    if isinstance(state, Mapping):
        items = [(k, detached(v)) for k, v in state.items()]
        if all(new is state[k] for k, new in items):
            return state
        out = type(state)(items)
        if hasattr(state, "_metadata"):
            out._metadata = state._metadata
        return out
    if type(state) in (list, tuple):
        items = [detached(v) for v in state]
        return state if all(new is old for new, old in zip(items, state, strict=True)) else type(state)(items)
    return state
