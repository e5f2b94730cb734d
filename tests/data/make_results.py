"""Writes tests/data/results/: the result files (spec.json, summary.json, status.json, inventory.json, baseline.json;
no checkpoint, no events) of three real tiny runs that the analysis tests read instead of training
(tests/test_analysis.py): one/ holds a dp=2 run, more/ a repeat of it and a dp=1 run. Re-run when the result schema
changes:

    .venv/bin/python tests/data/make_results.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TINY = ["tiny", "engine=default", "iters=4", "save_interval=2", "after=2"]
FILES = ("spec.json", "summary.json", "status.json", "inventory.json", "baseline.json")


def main() -> None:
    out = HERE / "results"
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        for n, layout in enumerate(("dp=2", "dp=2", "dp=1")):
            proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), *TINY, layout,
                                   f"results_dir={scratch}/{n}"], check=True, capture_output=True, text=True)
            run_dir = Path(proc.stdout.strip().splitlines()[-1])
            dest = out / ("one" if n == 0 else "more") / run_dir.name
            dest.mkdir(parents=True)
            for name in FILES:
                if (run_dir / name).is_file():
                    shutil.copy(run_dir / name, dest / name)
            print(dest)


if __name__ == "__main__":
    main()
