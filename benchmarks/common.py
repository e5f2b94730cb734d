"""What the benchmarks share: a run through `./submit-job.sh`, medians of what the repeats measured, a table of
them, and the command line of those that measure into a folder and then evaluate it."""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def submitted(tokens: list[str], check: bool = True) -> Path | None:
    """`./submit-job.sh TOKENS`: the run's folder (the last line it prints). A failed run ends the benchmark with its
    error (check) or is said on stderr and is None: the rounds go on, and the tables leave it out."""
    proc = subprocess.run([str(REPO / "submit-job.sh"), *tokens], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        if check:
            sys.exit(f"{' '.join(tokens)} failed: {proc.stderr.strip()[-600:]}")
        print(f"{' '.join(tokens)} failed: {proc.stderr.strip()[-600:]}", file=sys.stderr, flush=True)
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


def median(values: list[float | None]) -> float | None:
    """The median of the values measured (None: not measured)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values: list[float | None]) -> str:
    """median (min-max) of the repeats' values."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def median_table(first: str, columns: tuple[str, ...], rows: dict[str, list[dict[str, float]]]) -> None:
    """A markdown table: per row label, each column's median over the rounds' figures."""
    print(f"| {first} | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for label, rounds in rows.items():
        print(f"| {label} | " + " | ".join(f"{statistics.median(r[c] for r in rounds):.2f}" for c in columns) + " |")


def measure_then_evaluate(measure: Callable[[Path, int], None], evaluate: Callable[[Path], None], repeats: int,
                          out: str) -> None:
    """`python -m benchmarks.X [REPEATS] [out=DIR] [reuse=true]`: measure REPEATS rounds into DIR (reuse=true: the
    runs already there), then evaluate them."""
    args = sys.argv[1:]
    repeats = int(args.pop(0)) if args and args[0].isdigit() else repeats
    folder = Path(next((a.split("=", 1)[1] for a in args if a.startswith("out=")), out))
    if "reuse=true" not in args:
        measure(folder, repeats)
    evaluate(folder)
