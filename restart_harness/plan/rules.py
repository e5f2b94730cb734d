"""DeepSpeed 0.19.8's placement rules, restated without torch so that a plan of a 70B layout takes milliseconds.
Each function names the DeepSpeed code it mirrors; tests/test_planner.py checks each against DeepSpeed's own
function on many inputs, so a DeepSpeed upgrade that changes a rule fails there first."""

from __future__ import annotations

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
    for each decoder layer and 0 for the embedding, final norm and head."""
    n, m = len(weights), num_parts
    if n <= m:
        return [min(p, n) for p in range(m + 1)]  # partition_uniform's trivial case
    inf = math.inf
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                max_sum = max(dp_max[k][j - 1], part)
                min_sum = min(dp_min[k][j - 1], part)
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j] = cost
                    dp_max[i][j] = max_sum
                    dp_min[i][j] = min_sum
                    position[i][j] = k
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][j])
    parts.reverse()
    return [int(p) for p in parts]


def zero1_partition_numel(numel: int, dp: int) -> int:
    """Elements of one data-parallel rank's ZeRO-1 partition of a flat parameter group of `numel` elements.

    DeepSpeedZeroOptimizer (stage_1_and_2.py) pads the flat group to a multiple of
    nccl_start_alignment_factor x dp (parameter_alignment off, the default) and splits it into dp equal parts.
    The state dict trims the padding with a slice, but torch.save writes a slice's whole storage, so every rank's
    file holds the full partition."""
    alignment = NCCL_START_ALIGNMENT_FACTOR * dp
    return math.ceil(numel / alignment) * alignment // dp


def zero1_flat_numel(numel: int, dp: int) -> int:
    """Elements of the padded flat parameter buffer (what a pp=1 model file stores: the module's weights are views
    into it, and DeepSpeed saves them without cloning)."""
    return zero1_partition_numel(numel, dp) * dp
