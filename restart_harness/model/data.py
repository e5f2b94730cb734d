"""Synthetic token batches. Sample i of step s is a pure function of (seed, s, i); a step's global batch is samples
0 .. micro_batch x grad_accum x dp - 1, and data-parallel rank d takes, in micro-batch m, the samples
(m x dp + d) x micro_batch + j. So a restarted run sees exactly the batches a continuous run would, and a restart at
another layout (dp, grad_accum, micro_batch) trains on the same global batch."""

from __future__ import annotations

import torch


def sample(seed: int, step: int, index: int, seq_len: int, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + index * 101)
    return torch.randint(0, vocab, (seq_len + 1,), generator=gen)


def step_batches(spec, step: int, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) of each gradient-accumulation micro-batch of one optimizer step, for one DP rank."""
    batches = [torch.stack([sample(spec.seed, step, (m * spec.dp + dp_rank) * spec.micro_batch + j, spec.seq_len,
                                   spec.shape.vocab_size) for j in range(spec.micro_batch)])
               for m in range(spec.grad_accum)]
    return [(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()) for tokens in batches]
