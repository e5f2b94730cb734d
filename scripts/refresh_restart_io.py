#!/usr/bin/env python3
"""Measure what a restart's ranks ask of the file systems at start-up, per stack and engine, and write the table the
predictor scales with (configs/restart_io.json; restart_harness/predict/restart_io.py).

Method: for each stack (DeepSpeed with engine=default, FSDP2 with DCP), `./submit-job.sh tiny dp=2 launcher=mpiexec
baseline=false` (mpiexec starts every rank's interpreter itself, so each rank imports for itself), and the figures
of its restart: per rank and start-up phase, metadata operations (opens, failed opens, stat-family calls, listings),
opens and bytes read through calls, outside the checkpoint. The counts are exact: one run per stack suffices; they
change with the software's versions, which the table records.

Usage: <python> scripts/refresh_restart_io.py   (the harness's Python; writes configs/restart_io.json)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from restart_harness.files.atomic import write_json_atomic
from restart_harness.predict import restart_io

REPO = Path(__file__).resolve().parent.parent

CASES = (["tiny", "dp=2"], ["tiny", "dp=2", "stack=fsdp2"])


def main() -> int:
    runs = []
    with tempfile.TemporaryDirectory(prefix="rh-restart-io-table-", ignore_cleanup_errors=True) as results:
        for case in CASES:
            args = [*case, "launcher=mpiexec", "baseline=false", f"results_dir={results}"]
            proc = subprocess.run([str(REPO / "submit-job.sh"), *args], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                print(f"{' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            runs.append(Path(proc.stdout.strip().splitlines()[-1]))
        stacks = restart_io.table(runs)
    versions = {p: metadata.version(p) for p in ("torch", "deepspeed")}
    write_json_atomic(restart_io.TABLE, {
        "about": "per rank and start-up phase: metadata operations (opens, failed opens, stat-family calls, "
                 "listings), opens and bytes read through calls outside the checkpoint; docs/restart-io.md",
        "measured": {"date": time.strftime("%Y-%m-%d"), "command": "python3 scripts/refresh_restart_io.py",
                     "python": sys.version.split()[0], **versions},
        "stacks": stacks})
    print(json.dumps(stacks, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
