"""Inside a Slurm or PBS job: `python -m restart_harness.phases.job RUN_DIR` runs the phases of the run prepare() wrote
at submission; `... RUN_DIR phase=restart key=value ...` runs restart-only re-runs of it."""

from __future__ import annotations

import sys
from pathlib import Path

from restart_harness.errors import exit_code


def main(argv: list[str] | None = None) -> int:
    """scancel, qdel and a walltime send SIGTERM first: the run is recorded as failed ("terminated", 143)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m restart_harness.phases.job RUN_DIR [phase=restart key=value ...]", file=sys.stderr)
        return 2
    return exit_code(lambda: _phases(Path(argv[0]).resolve(), argv[1:]), interrupted=(143, "terminated"))


def _phases(run_dir: Path, tokens: list[str]) -> int:
    from restart_harness import machine, preflight
    from restart_harness.command.parse import parse_restart
    from restart_harness.files.atomic import read_json
    from restart_harness.phases.run import execute, in_job, restart_only
    from restart_harness.results import terminal

    if tokens:  # a restart-only job: checked again here, then launched directly (we are in the allocation)
        request = parse_restart([*tokens, f"run={run_dir}"], machine.complete_in_job)
        preflight.restart(request)
        restart_only(request)
    else:
        execute(in_job(run_dir))
    print(terminal.render(read_json(run_dir / "summary.json")))
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
