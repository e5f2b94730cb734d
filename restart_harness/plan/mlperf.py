"""MLPerf Storage v2.0's four checkpoint workloads (its Submission_guidelines.md, section 2.2, Table 2) as harness
runs: the model preset, DeepSpeed layout and ZeRO stage of each, its stated checkpoint size, and the exact size of
DeepSpeed 0.19.8's checkpoint for it from the planner. Launches nothing (`./submit-job.sh mlperf` prints the table;
`./submit-job.sh mlperf WORKLOAD` runs one: launch/mlperf.py)."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


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
    Workload("llama3-1t", "llama3-1T", 8, 64, 2, 1, "18 TB", 18e12),
)}

# MLPerf's 10 checkpoints written, then 10 read (Table 3: not changeable), and five runs averaged.
CHECKPOINTS, READS, RUNS = 10, 10, 5
BYTES_PER_PARAMETER = 14  # bf16 weights (2) + fp32 master weights (4) + two fp32 Adam moments (8)

WHY = {
    3: "ZeRO-3's model files hold empty placeholders: the bf16 weights (2 of the 14 bytes per parameter) are not "
       "written; the fp32 master weights in the optimizer files stand for them",
    1: "ZeRO-1 writes the bf16 weights (model and layer files) and the fp32 optimizer state: 14 bytes per parameter, "
       "plus DeepSpeed's pickle and zip framing",
}


def get(name: str) -> Workload:
    from restart_harness.errors import UsageError

    found = WORKLOADS.get(name.lower())
    if found is None:
        raise UsageError(f"mlperf {name}: not an MLPerf Storage v2.0 checkpoint workload; accepted: "
                         f"{', '.join(WORKLOADS)}")
    return found


def sizes() -> list[dict]:
    """Each workload: its layout, stated size, 14 bytes per parameter of the preset's shape, and DeepSpeed's exact
    checkpoint (the planner's files for the workload's layout)."""
    from restart_harness.command import parse
    from restart_harness.plan import checkpoint

    rows = []
    for w in WORKLOADS.values():
        spec = parse.parse_run([w.preset, *w.layout_tokens])[0]
        files = checkpoint.stored_files(spec)
        params = spec.shape.num_parameters()
        exact = sum(f.bytes for f in files)
        rows.append({"workload": w.name, "preset": w.preset, "layout": f"{w.tp}x{w.pp}x{w.dp}", "zero": w.zero,
                     "ranks": w.ranks, "parameters": params, "stated": w.stated, "stated_bytes": w.stated_bytes,
                     "rule_bytes": params * BYTES_PER_PARAMETER, "deepspeed_bytes": exact,
                     "deepspeed_files": len(files), "why": WHY[w.zero]})
    return rows


def render_sizes(rows: list[dict]) -> str:
    lines = ["MLPerf Storage v2.0 checkpoint workloads (Submission_guidelines.md, Table 2) and DeepSpeed 0.19.8's "
             "checkpoint of each, from the planner",
             f"{'workload':<12} {'TPxPPxDP':>9} {'ZeRO':>4} {'ranks':>5} {'parameters':>17} {'stated':>8} "
             f"{'14 B/param':>12} {'DeepSpeed':>12} {'files':>6}"]
    for r in rows:
        lines.append(f"{r['workload']:<12} {r['layout']:>9} {r['zero']:>4} {r['ranks']:>5} {r['parameters']:>17,} "
                     f"{r['stated']:>8} {r['rule_bytes'] / GIB:>8.2f} GiB {r['deepspeed_bytes'] / GIB:>8.2f} GiB "
                     f"{r['deepspeed_files']:>6}")
    lines += ["",
              "stated: MLPerf's Table 2; its 8B, 70B and 405B figures are 14 bytes per parameter of these shapes in "
              "GiB (bf16 weights, fp32 master weights, two fp32 Adam moments).",
              *[f"{w}: {WHY[z]}." for w, z in (("ZeRO-3 (8b, 70b)", 3), ("ZeRO-1 (405b, 1t)", 1))],
              "1t: Table 2's hidden size 25872 over 192 heads is no whole head dimension; the preset takes 134 "
              "(docs/planner.md). 14 bytes per parameter of the stated shape is 16.56e12 bytes, not 18 TB; "
              "counting the key and value projections as wide as the query's (no grouped-query attention) gives "
              "18.56e12.",
              "Run one, scaled down to this machine: ./submit-job.sh mlperf llama3-8b shrink=64 (docs/mlperf.md)"]
    return "\n".join(lines)
