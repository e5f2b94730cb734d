"""Megatron-style tensor parallelism over one process group: the four communication functions and the
column / row / vocabulary-parallel layers built from them."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from restart_harness.spec.parameters import Param


class TPGroup:
    """The tensor-parallel group of this rank (size 1: no communication at all)."""

    def __init__(self, group=None, rank: int = 0, size: int = 1):
        self.group, self.rank, self.size = group, rank, size


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (input of column-parallel layers)."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward; identity backward (output of row-parallel layers)."""

    @staticmethod
    def forward(ctx, x, tp):
        x = x.contiguous()
        dist.all_reduce(x, group=tp.group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last dimension forward; keep the local slice backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.tp.size, dim=-1)[ctx.tp.rank].contiguous(), None


def copy_to_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _CopyToTP.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


def gather_last_dim(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _GatherLastDim.apply(x, tp)


def _mark_sharded(weight: torch.Tensor) -> None:
    # DeepSpeed's gradient norm counts a parameter on every TP rank only when it is marked model-parallel;
    # unmarked (replicated) parameters are counted on TP rank 0 alone.
    weight.tensor_model_parallel = True


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W split by output rows; the caller applies copy_to_tp to x once for all siblings."""

    def __init__(self, param: Param, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(param.shape))  # (out_features / tp, in_features); row: (out, in / tp)
        nn.init.normal_(self.weight, mean=0.0, std=1.0 / math.sqrt(param.fan_in))
        _mark_sharded(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(ColumnParallelLinear):
    """y = sum over TP ranks of x_local W_local^T, W split by input columns."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(super().forward(x), self.tp)


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows; ids outside this rank's range contribute zeros."""

    def __init__(self, param: Param, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.per_rank = param.shape[0]  # vocabulary rows of this rank
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(param.shape))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)
        _mark_sharded(self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.tp)
