"""A restart at another layout (`restart run=DIR tp=... dp=...`): the run's spec at the layout given, training on the
run's global batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from restart_harness.errors import UsageError
from restart_harness.spec.runspec import RunSpec

LAYOUT_KEYS = frozenset({"tp", "pp", "dp", "nodes", "ranks_per_node"})


def restart_layout(spec: RunSpec, original: RunSpec, given: Collection[str], check: Callable[[RunSpec], None]
                   ) -> RunSpec:
    """Keys not given keep the run's values (ranks per node follows); the model must fit the new layout, and so must
    the stack (check: its refusals); the global batch stays the run's (micro-batch and accumulation adjusted), so the
    first step after the restart trains on the same samples as at the original layout."""
    layout = {}
    if "ranks_per_node" not in given:
        layout["ranks_per_node"] = None
    if "dp" not in given and "ranks_per_node" in given:
        layout["dp"] = None
    spec = spec.with_layout(**layout)
    check(spec)
    batch = original.global_batch
    if batch % spec.dp:
        raise UsageError(f"dp={spec.dp}: the run's global batch of {batch} samples (micro_batch {original.micro_batch} "
                         f"x grad_accum {original.grad_accum} x dp {original.dp}) does not split over {spec.dp} "
                         "data-parallel ranks; accepted: dp dividing it")
    per_rank = batch // spec.dp
    micro_batch = max(m for m in range(1, min(original.micro_batch, per_rank) + 1) if per_rank % m == 0)
    return dataclasses.replace(spec, micro_batch=micro_batch, grad_accum=per_rank // micro_batch)
