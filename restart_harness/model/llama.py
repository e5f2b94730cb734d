"""The LLaMA architecture (RMSNorm, SwiGLU, rotary, grouped-query attention, untied embedding and head), Megatron-style
tensor-parallel, as one module for pp=1 or as DeepSpeed PipelineModule layers for pp>1; and the synthetic token
batches it trains on. Parameter names follow transformers' LlamaForCausalLM, names and local shapes come from
restart_harness.spec.parameters, the table the checkpoint planner sizes files from (docs/planner.md)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from restart_harness.spec import parameters as table
from restart_harness.spec.model_shape import ModelShape
from restart_harness.spec.parameters import Param


class TPGroup:
    """The tensor-parallel group of this rank (size 1: no communication at all)."""

    def __init__(self, group=None, rank: int = 0, size: int = 1):
        self.group, self.rank, self.size = group, rank, size


def _all_reduce(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, group=tp.group)
    return x


class _AllReduce(torch.autograd.Function):
    """All-reduce forward and identity backward (output of row-parallel layers), or with in_backward the other way
    round: identity forward, all-reduce of the gradient backward (input of column-parallel layers)."""

    @staticmethod
    def forward(ctx, x, tp, in_backward):
        ctx.tp, ctx.in_backward = tp, in_backward
        return x if in_backward else _all_reduce(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return (_all_reduce(grad, ctx.tp) if ctx.in_backward else grad), None, None


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
    return x if tp.size == 1 else _AllReduce.apply(x, tp, True)


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _AllReduce.apply(x, tp, False)


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


class RMSNorm(nn.Module):
    def __init__(self, param: Param, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(param.shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding on [batch, heads, seq, head_dim] (computed on the fly: no buffers saved)."""
    seq, dim = q.shape[-2], q.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=q.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=q.device, dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class Attention(nn.Module):
    """Grouped-query attention; q/k/v column-parallel and o row-parallel, so heads split across TP ranks."""

    def __init__(self, shape: ModelShape, tp: TPGroup, params: dict[str, Param]):
        super().__init__()
        self.tp, self.theta = tp, shape.rope_theta
        self.head_dim = shape.dim_per_head
        self.heads = shape.num_attention_heads // tp.size
        self.kv_heads = shape.num_key_value_heads // tp.size
        self.q_proj = ColumnParallelLinear(params["q_proj.weight"], tp)
        self.k_proj = ColumnParallelLinear(params["k_proj.weight"], tp)
        self.v_proj = ColumnParallelLinear(params["v_proj.weight"], tp)
        self.o_proj = RowParallelLinear(params["o_proj.weight"], tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_tp(x, self.tp)
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, self.theta)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate/up column-parallel, down row-parallel."""

    def __init__(self, tp: TPGroup, params: dict[str, Param]):
        super().__init__()
        self.tp = tp
        self.gate_proj = ColumnParallelLinear(params["gate_proj.weight"], tp)
        self.up_proj = ColumnParallelLinear(params["up_proj.weight"], tp)
        self.down_proj = RowParallelLinear(params["down_proj.weight"], tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _seeded(seed: int, index: int, tp: TPGroup) -> None:
    # Same weights on every data-parallel replica; each TP rank its own shard's seed.
    torch.manual_seed(seed * 100_003 + index * 1_009 + tp.rank)


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape, tp: TPGroup, index: int, seed: int):
        super().__init__()
        _seeded(seed, index, tp)
        params = table.by_name(table.layer_params(shape, tp.size, table.DECODER))
        self.input_layernorm = RMSNorm(params["input_layernorm.weight"], shape.rms_norm_eps)
        self.self_attn = Attention(shape, tp, table.by_name(list(params.values()), "self_attn."))
        self.post_attention_layernorm = RMSNorm(params["post_attention_layernorm.weight"], shape.rms_norm_eps)
        self.mlp = MLP(tp, table.by_name(list(params.values()), "mlp."))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, shape: ModelShape, tp: TPGroup, seed: int):
        super().__init__()
        _seeded(seed, 0, tp)
        (param,) = table.layer_params(shape, tp.size, table.EMBEDDING)
        self.embed_tokens = VocabParallelEmbedding(param, tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class FinalNorm(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        (param,) = table.layer_params(shape, 1, table.FINAL_NORM)  # replicated: the same on every TP rank
        self.norm = RMSNorm(param, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class LMHead(nn.Module):
    """Vocabulary-parallel output head; logits gathered over TP so the loss sees the whole vocabulary."""

    def __init__(self, shape: ModelShape, tp: TPGroup, seed: int):
        super().__init__()
        _seeded(seed, shape.num_hidden_layers + 1, tp)
        self.tp = tp
        (param,) = table.layer_params(shape, tp.size, table.LM_HEAD)
        self.lm_head = ColumnParallelLinear(param, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(copy_to_tp(x, self.tp))
        return logits if self.tp.size == 1 else _GatherLastDim.apply(logits, self.tp)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def _layer(kind: str, index: int, shape: ModelShape, tp: TPGroup, seed: int) -> tuple[type[nn.Module], tuple]:
    """Pipeline layer `index` (embedding, decoder layers, final norm, head): its class and arguments."""
    return {table.EMBEDDING: (Embedding, (shape, tp, seed)), table.DECODER: (DecoderLayer, (shape, tp, index, seed)),
            table.FINAL_NORM: (FinalNorm, (shape,)), table.LM_HEAD: (LMHead, (shape, tp, seed))}[kind]


class LlamaForCausalLM(nn.Module):
    """pp=1: the whole (TP-sharded) model as one module; forward returns the loss. Its pipeline layers are children
    named by index, as in DeepSpeed's PipelineModule ("0.embed_tokens.weight", "1.input_layernorm.weight", ...), so
    a parameter has the same name at every pipeline degree and checkpoints convert across pp (universal
    checkpointing keys on these names)."""

    def __init__(self, shape: ModelShape, tp: TPGroup, seed: int):
        super().__init__()
        self.kinds = table.pipeline_layers(shape)
        for i, kind in enumerate(self.kinds):
            cls, args = _layer(kind, i, shape, tp, seed)
            self.add_module(str(i), cls(*args))

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = ids
        for i in range(len(self.kinds)):
            x = self._modules[str(i)](x)
        return lm_loss(x, labels)


def pipeline_module(shape: ModelShape, tp: TPGroup, seed: int, topology):
    """pp>1: DeepSpeed PipelineModule of LayerSpecs, partitioned by decoder layer like Megatron-DeepSpeed."""
    from deepspeed.pipe import LayerSpec, PipelineModule

    # Pipeline layer i is the file layer_{i:02d}-model_TT-model_states.pt: the planner reads the same list.
    layers = [LayerSpec(cls, *args) for cls, args in (_layer(kind, i, shape, tp, seed)
                                                       for i, kind in enumerate(table.pipeline_layers(shape)))]
    return PipelineModule(layers=layers, loss_fn=lm_loss, topology=topology,
                          partition_method="type:DecoderLayer", activation_checkpoint_interval=0)


def sample(seed: int, step: int, index: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Sample `index` of a step's global batch: a pure function of (seed, step, index), so a restarted run, at any
    layout, trains on the batches a continuous run would (docs/reshard.md)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + index * 101)
    return torch.randint(0, vocab, (seq_len + 1,), generator=gen)


def step_batches(spec, step: int, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) of each gradient-accumulation micro-batch of one optimizer step, for one DP rank: in
    micro-batch m, data-parallel rank d takes the samples (m x dp + d) x micro_batch + j."""
    batches = [torch.stack([sample(spec.seed, step, (m * spec.dp + dp_rank) * spec.micro_batch + j, spec.seq_len,
                                   spec.shape.vocab_size) for j in range(spec.micro_batch)])
               for m in range(spec.grad_accum)]
    return [(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()) for tokens in batches]
