"""MLPerf Storage v2.0's four checkpoint workloads (its Submission_guidelines.md, section 2.2, Table 2) as harness
runs: the model preset, DeepSpeed layout and ZeRO stage of each, and its stated checkpoint size (campaigns/mlperf.py
prints them beside DeepSpeed 0.19.8's exact checkpoint from the planner, and runs one)."""

from __future__ import annotations

from dataclasses import dataclass

from restart_harness.errors import UsageError


@dataclass(frozen=True)
class Workload:
    name: str  # MLPerf's (mlpstorage --model)
    preset: str  # configs/models/<preset>.yaml
    tp: int
    pp: int
    dp: int
    zero: int
    stated: str  # Table 2's checkpoint size, as written there
    stated_bytes: float  # ... read as decimal units

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def layout_tokens(self) -> list[str]:
        return [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"zero={self.zero}"]


WORKLOADS = {w.name: w for w in (
    Workload("llama3-8b", "llama3-8B", 1, 1, 8, 3, "105 GB", 105e9),
    Workload("llama3-70b", "llama3-70B", 8, 1, 8, 3, "912 GB", 912e9),
    Workload("llama3-405b", "llama3-405B", 8, 32, 2, 1, "5.29 TB", 5.29e12),
    Workload("llama3-1t", "llama3-1T", 8, 64, 2, 1, "18 TB", 18e12))}

# MLPerf's 10 checkpoints written, then 10 read (Table 3: not changeable), and five runs averaged.
CHECKPOINTS, READS, RUNS = 10, 10, 5
BYTES_PER_PARAMETER = 14  # bf16 weights (2) + fp32 master weights (4) + two fp32 Adam moments (8)

WHY = {
    3: "ZeRO-3's model files hold empty placeholders: the bf16 weights (2 of the 14 bytes per parameter) are not "
       "written; the fp32 master weights in the optimizer files stand for them",
    1: "ZeRO-1 writes the bf16 weights (model and layer files) and the fp32 optimizer state: 14 bytes per parameter, "
       "plus DeepSpeed's pickle and zip framing"}


def get(name: str) -> Workload:
    found = WORKLOADS.get(name.lower())
    if found is None:
        raise UsageError(f"mlperf {name}: not an MLPerf Storage v2.0 checkpoint workload; accepted: "
                         f"{', '.join(WORKLOADS)}")
    return found
