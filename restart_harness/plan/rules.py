"""DeepSpeed 0.19.8's placement rules, restated without torch so that a plan of a 70B layout takes milliseconds.
Each function names the DeepSpeed code it mirrors; tests/test_planner.py checks each against DeepSpeed's own
function on many inputs, so a DeepSpeed upgrade that changes a rule fails there first."""

from __future__ import annotations

import itertools
import math

# DeepSpeedZeroOptimizer.nccl_start_alignment_factor: "4-byte alignment/sizeof(fp16) = 2".
NCCL_START_ALIGNMENT_FACTOR = 2


def global_rank(stage: int, dp_rank: int, tp_rank: int, dp: int, tp: int) -> int:
    """PipeModelDataParallelTopology(num_pp, num_mp, num_dp): axes (pipe, data, model), model varying fastest."""
    return (stage * dp + dp_rank) * tp + tp_rank


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """deepspeed.runtime.utils.partition_balanced: stage boundaries minimizing (max - min) stage weight.

    The same dynamic programme, ties resolved the same way (a later split point wins on equal cost), so the
    boundaries are DeepSpeed's exactly. PipelineModule(partition_method="type:DecoderLayer") calls it with weight 1
    for each decoder layer and 0 for the embedding, final norm and head. Its work grows as layers^2 x parts: with
    numpy every split point of a stage count is tried at once (a 1,024-layer, 64-stage plan in about a second)."""
    n, m = len(weights), num_parts
    if n <= m:
        return [min(p, n) for p in range(m + 1)]  # partition_uniform's trivial case
    import numpy  # a base dependency (pyproject.toml); imported here, where a split is planned

    position = _positions_numpy(numpy, [0, *itertools.accumulate(weights)], n, m)
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][j])
    parts.reverse()
    return [int(p) for p in parts]


def _positions_numpy(np, prefix: list[int], n: int, m: int) -> list[list[int]]:
    """DeepSpeed's programme, one row i at a time: every (split point k, part count j) of the row at once; the chosen
    k of a column is the last one of least cost (DeepSpeed's `>=` keeps the later of equal costs). In DeepSpeed's loop
    a split point k < j - 1 leaves fewer than j - 1 layers for j - 1 parts: its cost is infinite, as here."""
    inf = np.inf
    dp_max = np.full((n + 1, m + 1), inf)
    dp_min = np.full((n + 1, m + 1), inf)
    position = np.zeros((n + 1, m + 1), dtype=np.int64)
    dp_max[0, 0] = 0.0
    pre = np.asarray(prefix, dtype=np.float64)
    for i in range(1, n + 1):
        cols = min(i, m)
        part = (pre[i] - pre[:i])[:, None]  # k = 0 .. i-1
        max_sum = np.maximum(dp_max[:i, :cols], part)  # column c is part count j = c + 1, reading j - 1 = c
        min_sum = np.minimum(dp_min[:i, :cols], part)
        cost = max_sum - min_sum
        k = np.arange(i)[:, None]
        cost[k < np.arange(cols)[None, :]] = inf  # k < j - 1
        last = i - 1 - np.argmin(cost[::-1], axis=0)  # the last k of least cost, per column
        j = np.arange(cols)
        position[i, 1:cols + 1] = last
        dp_max[i, 1:cols + 1] = max_sum[last, j]
        dp_min[i, 1:cols + 1] = min_sum[last, j]
    return position.tolist()


def zero1_partition_numel(numel: int, dp: int) -> int:
    """Elements of one data-parallel rank's ZeRO-1 partition of a flat parameter group of `numel` elements:
    DeepSpeedZeroOptimizer (stage_1_and_2.py) pads the flat group to a multiple of nccl_start_alignment_factor x dp
    (parameter_alignment off, the default) and splits it into dp equal parts (docs/planner.md, placement)."""
    alignment = NCCL_START_ALIGNMENT_FACTOR * dp
    return math.ceil(numel / alignment) * alignment // dp


def zero1_flat_numel(numel: int, dp: int) -> int:
    """Elements of the padded flat parameter buffer (what a pp=1 model file stores: the module's weights are views
    into it, and DeepSpeed saves them without cloning)."""
    return zero1_partition_numel(numel, dp) * dp


# DeepSpeed 0.19.8's default zero_optimization.sub_group_size: ZeRO-3 keeps the optimizer state of a rank's partition
# in sub-groups of about this many elements, each with its own flat fp32 tensor, Adam moments and step.
ZERO3_SUB_GROUP_SIZE = 10**9


def zero3_partition_numel(numel: int, dp: int) -> int:
    """Elements of one data-parallel rank's ZeRO-3 partition of one parameter: partition_parameters.py pads each
    parameter to a multiple of dp and gives every rank an equal part."""
    return -(-numel // dp)


def zero3_partition_groups(param_numels: list[int], dp: int, sub_group_size: int = ZERO3_SUB_GROUP_SIZE) -> list[int]:
    """Elements of each optimizer sub-group of one rank's ZeRO-3 partition (zero3_sub_groups)."""
    return [numel for _, _, numel in zero3_sub_groups(param_numels, dp, sub_group_size)]


def zero3_sub_groups(param_numels: list[int], dp: int,
                     sub_group_size: int = ZERO3_SUB_GROUP_SIZE) -> list[tuple[int, int, int]]:
    """(first parameter, last parameter, elements) of each optimizer sub-group of one rank's ZeRO-3 partition
    (stage3.py _create_fp16_sub_groups: the parameters in order, a sub-group closed once it holds sub_group_size
    elements or at the last parameter)."""
    parts = [zero3_partition_numel(n, dp) for n in param_numels]
    if sub_group_size >= sum(parts):
        return [(0, len(parts) - 1, sum(parts))]
    groups, first, current = [], 0, 0
    for i, part in enumerate(parts):
        current += part
        if current >= sub_group_size or i == len(parts) - 1:
            groups.append((first, i, current))
            first, current = i + 1, 0
    return groups
