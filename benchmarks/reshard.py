#!/usr/bin/env python3
"""Restart at another layout against a restart at the layout that wrote the checkpoint.

Method: docs/benchmark-methods.md#reshard

Usage: .venv/bin/python -m benchmarks.reshard [REPEATS] [MODEL]     (default 2 small)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks.common import MIB, median, restarted, submitted, words

COMMON = ["iters=2", "save_interval=2", "after=1", "cache=drop"]
# source layout -> target layouts: every change of issue 15 (dp 2->1, 1->2, 2->4; tp 1->2, 2->1; pp 1->2, 2->1; one
# combined change)
PLAN = {
    "dp=2": ["dp=1", "dp=4", "tp=2 dp=2", "pp=2 dp=2", "tp=2 pp=2 dp=1"],
    "tp=2 pp=2 dp=1": ["tp=1 pp=2 dp=2", "tp=2 pp=1 dp=2", "tp=1 pp=1 dp=2"], "dp=1": ["dp=2"]}
PHASES = ("checkpoint_load", "engine_init", "total")


def med(rs: list[dict], key: str) -> float | None:
    return median([(x["phases"].get(key) if key != "total" else x["total_seconds"]) for x in rs])


def rows_of(model: str, source: str, targets: list[str], repeats: int, results: Path) -> list[dict]:
    """One run at source, then each round a cold restart at source and at each target: a row per target."""
    run_dir = submitted([model, *source.split(), *COMMON, f"results_dir={results}"])
    print(f"[{model} {source}] {run_dir}", file=sys.stderr, flush=True)
    records: dict[str, list[dict]] = {"same": [], **{t: [] for t in targets}}
    for r in range(repeats):
        for target, got in records.items():
            got.append(restarted(run_dir, ["cache=drop", *([] if target == "same" else target.split())]))
            print(f"  round {r + 1}: {target}: {got[-1]['record']}", file=sys.stderr, flush=True)
    same = records.pop("same")
    base = {k: med(same, k) for k in PHASES}
    rows = [{"source": source, "target": "(same layout)", **{f"{k}_s": v for k, v in base.items()},
             "verified": all(x["verified"] for x in same)}]
    for target, rs in records.items():
        conv = next((x["conversion"] for x in rs if x.get("conversion") and not x["conversion"]["reused"]),
                    rs[0].get("conversion") or {})
        row = {"source": source, "target": target, "conversion_s": conv.get("seconds"),
               "conversion_files": conv.get("files_written"), "conversion_written_mib": conv["bytes_written"] / MIB,
               "conversion_read_mib": (conv.get("bytes_read_counted") or 0) / MIB,
               "verified": all(x["verified"] for x in rs),
               "loss_rel_diff_max": max((x.get("loss_continuity") or {}).get("rel_diff", 0.0) for x in rs)}
        for k in PHASES:
            row[f"{k}_s"] = v = med(rs, k)
            row[f"{k}_ratio"] = v / base[k] if v and base[k] else None
        rows.append(row)
    return rows


def f(v, d=2):
    return "" if v is None else f"{v:.{d}f}"


def main() -> None:
    repeats, _, rest = words(2, runs=True)
    model = rest[0] if rest else "small"
    results = Path(tempfile.mkdtemp(prefix="rh-bench-reshard-"))
    rows = [row for source, targets in PLAN.items() for row in rows_of(model, source, targets, repeats, results)]
    (results / "reshard.json").write_text(json.dumps({"model": model, "repeats": repeats, "rows": rows}, indent=1))
    print(f"# {model}, medians over {repeats} rounds (results in {results})")
    print("| source | target | conversion s | conv. files | conv. written MiB | conv. read MiB | checkpoint_load s "
          "(x same) | engine_init s (x same) | restart total s (x same) | loss rel diff | verified |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        loss = f"{r['loss_rel_diff_max']:.1e}" if "loss_rel_diff_max" in r else ""
        print(f"| {r['source']} | {r['target']} | {f(r.get('conversion_s'))} | {r.get('conversion_files') or ''} | "
              f"{f(r.get('conversion_written_mib'), 1)} | {f(r.get('conversion_read_mib'), 1)} | "
              + "".join(f"{f(r[f'{k}_s'])} ({f(r.get(f'{k}_ratio'))}) | " for k in PHASES)
              + f"{loss} | {r['verified']} |")


if __name__ == "__main__":
    main()
