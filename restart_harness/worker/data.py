"""Synthetic token batches: a pure function of (seed, step, micro-batch, data-parallel rank), so a
restarted run sees exactly the batches a continuous run would."""

from __future__ import annotations

import torch


def micro_batch(seed: int, step: int, micro: int, dp_rank: int, batch: int, seq_len: int, vocab: int):
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + micro * 101 + dp_rank)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def step_batches(spec, step: int, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The gradient-accumulation micro-batches of one optimizer step."""
    return [
        micro_batch(spec.seed, step, m, dp_rank, spec.micro_batch, spec.seq_len, spec.shape.vocab_size)
        for m in range(spec.grad_accum)
    ]
