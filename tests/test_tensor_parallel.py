"""The Megatron-style split computes the same model: a tp=1 model's weights, sharded onto 2 gloo ranks, give
the same loss and the same (sharded) gradients, with grouped-query attention (4 heads, 2 kv heads)."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from restart_harness.model.llama import LlamaForCausalLM, TPGroup, sample
from restart_harness.spec.model_shape import ModelShape

SHAPE = ModelShape(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=96, max_position_embeddings=16)
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head", "embed_tokens")  # split dim 0
ROW = ("o_proj", "down_proj")  # split dim 1


def shard_dim(name: str) -> int | None:
    if any(f".{part}." in f".{name}" for part in COLUMN):
        return 0
    if any(f".{part}." in f".{name}" for part in ROW):
        return 1
    return None  # norms: replicated


def _worker(rank: int, init_file: str, queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    tokens = torch.stack([sample(seed=7, step=1, index=j, seq_len=12, vocab=SHAPE.vocab_size) for j in range(2)])
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    full = LlamaForCausalLM(SHAPE, TPGroup(), seed=3)
    full_loss = full(ids, labels)
    full_loss.backward()
    tp = TPGroup(dist.group.WORLD, rank, 2)
    split = LlamaForCausalLM(SHAPE, tp, seed=99)
    full_params = dict(full.named_parameters())
    with torch.no_grad():
        for name, p in split.named_parameters():
            dim = shard_dim(name)
            src = full_params[name]
            p.copy_(src if dim is None else src.chunk(2, dim=dim)[rank])
    loss = split(ids, labels)
    loss.backward()
    worst = 0.0
    for name, p in split.named_parameters():
        dim = shard_dim(name)
        want = full_params[name].grad
        want = want if dim is None else want.chunk(2, dim=dim)[rank]
        worst = max(worst, (p.grad - want).abs().max().item())
    queue.put((rank, full_loss.item(), loss.item(), worst))
    dist.destroy_process_group()


def test_tp2_equals_tp1():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_worker, args=(r, os.path.join(d, "init"), queue)) for r in range(2)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    for rank, full_loss, split_loss, worst_grad_error in results:
        assert split_loss == pytest.approx(full_loss, rel=1e-5), rank
        # Norm gradients are complete on every rank (the copy-to-TP backward all-reduces their inputs' grads).
        assert worst_grad_error < 1e-5, rank
