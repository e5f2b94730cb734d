"""The DeepSpeed JSON config of a run: its ZeRO stage, torch AdamW, bf16 or fp32, plus the engine's block."""

from __future__ import annotations

import copy

from restart_harness.resolve import Plugins


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def build_ds_config(plugins: Plugins) -> dict:
    """ds_config.json contents; the engine plug-in may add its own block (datastates_ckpt, checkpoint.writer)."""
    spec = plugins.spec
    config = {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "zero_optimization": {"stage": spec.zero},
        "optimizer": {
            "type": "AdamW",
            # torch_adam: FusedAdam needs CUDA; torch's AdamW is the same math on every device.
            "params": {"lr": spec.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                       "torch_adam": True},
        },
        "gradient_clipping": 1.0,
        "bf16": {"enabled": spec.precision == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    return deep_merge(config, plugins.engine.ds_config())
