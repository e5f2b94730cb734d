"""Digests of a rank's model and optimizer state, streamed one tensor at a time (no second copy of the
state: a device tensor is copied to host alone, hashed, dropped)."""

from __future__ import annotations

import hashlib

import torch


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}:{t.numel()}:".encode())
    if t.numel():
        h.update(t.view(torch.uint8).numpy())
    return h.hexdigest()


def _value_digest(value) -> str:
    if isinstance(value, torch.Tensor):
        return tensor_digest(value)
    return hashlib.blake2b(repr(value).encode(), digest_size=16).hexdigest()


def state_digests(engine) -> dict[str, str]:
    """name -> digest for every tensor this rank restores: module weights, ZeRO fp32 master partition,
    optimizer moments and step, and the engine's step counters."""
    out = {f"module.{name}": tensor_digest(t) for name, t in engine.module.state_dict().items()}
    zero = engine.optimizer
    inner = getattr(zero, "optimizer", zero)
    masters = getattr(zero, "single_partition_of_fp32_groups", None)
    params = masters if masters is not None else [p for g in inner.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        out[f"optimizer.master.{i}"] = tensor_digest(p)
        for key, value in sorted(inner.state.get(p, {}).items()):
            out[f"optimizer.state.{i}.{key}"] = _value_digest(value)
    out["engine.global_steps"] = _value_digest(engine.global_steps)
    out["engine.global_samples"] = _value_digest(engine.global_samples)
    return out


def combined(digests: dict[str, str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(digests):
        h.update(f"{name}={digests[name]};".encode())
    return h.hexdigest()


def differences(saved: dict[str, str], restored: dict[str, str]) -> list[str]:
    names = sorted(set(saved) | set(restored))
    return [n for n in names if saved.get(n) != restored.get(n)]
