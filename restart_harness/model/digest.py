"""Digests of a rank's model and optimizer state, computed where the state lives (on the GPU for CUDA runs: only two
integers per tensor come back to the host): the dtype, shape, the plain and the block-weighted sums of the tensor's
64-bit words (mod 2^64) and its trailing bytes. What they catch, what they miss and what they cost:
docs/anatomy.md and docs/measurements.md."""

from __future__ import annotations

import hashlib

import torch

BLOCK_WORDS = 1024  # 8 KiB blocks


def _sums(t: torch.Tensor) -> tuple[torch.Tensor, bytes]:
    """(the plain and the block-weighted sums of the tensor's bytes as int64 words, both on the tensor's device, not
    yet read; the trailing bytes that do not fill a word)."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    whole = flat.numel() // 8 * 8
    tail = flat[whole:].cpu().numpy().tobytes() if whole < flat.numel() else b""
    words = flat[:whole].view(torch.int64)
    n = words.numel()
    full = n // BLOCK_WORDS * BLOCK_WORDS
    blocks = words[:full].view(-1, BLOCK_WORDS).sum(dim=1)  # int64 sums wrap modulo 2^64
    rest = words[full:].sum()
    weights = torch.arange(1, blocks.numel() + 1, dtype=torch.int64, device=words.device)
    return torch.stack([blocks.sum() + rest, (blocks * weights).sum() + rest * (blocks.numel() + 1)]), tail


def digests(values: dict[str, object]) -> dict[str, str]:
    """name -> digest of each value (a tensor's as tensor_digest(), anything else its repr): every tensor's sums
    queued first, then read back once a device (one synchronization for a rank's whole state on a GPU, not one a
    tensor; issue 67 measured the state's digest at 0.128 s a rank at `small dp=2`)."""
    pending = {name: (v, *_sums(v)) for name, v in values.items() if isinstance(v, torch.Tensor)}
    by_device: dict[torch.device, list[str]] = {}
    for name, (_, sums, _) in pending.items():
        by_device.setdefault(sums.device, []).append(name)
    read = {}
    for names in by_device.values():
        both = torch.stack([pending[n][1] for n in names]).cpu().tolist()
        read.update(zip(names, both, strict=True))
    def text(name: str, value) -> str:
        if name not in pending:
            return repr(value)
        (t, _, tail), (plain, weighted) = pending[name], read[name]
        return f"{t.dtype}:{tuple(t.shape)}:{plain & (2**64 - 1):016x}{weighted & (2**64 - 1):016x}:{tail.hex()}"

    return {name: text(name, value) for name, value in values.items()}


def tensor_digest(t: torch.Tensor) -> str:
    return digests({"": t})[""]


def combined(digests: dict[str, str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(digests):
        h.update(f"{name}={digests[name]};".encode())
    return h.hexdigest()


def differences(saved: dict[str, str], restored: dict[str, str]) -> list[str]:
    return [n for n in sorted(set(saved) | set(restored)) if saved.get(n) != restored.get(n)]
