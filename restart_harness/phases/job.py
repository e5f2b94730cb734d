"""Inside a Slurm or PBS job: `python -m restart_harness.phases.job RUN_DIR` runs the phases of a run that
rundir/create.py prepare() wrote at submission (checkpoint launch, page cache, restart launch, finalize), into that directory;
`... RUN_DIR phase=restart key=value ...` runs restart-only re-runs of it (submitted by phase=restart)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from restart_harness.errors import RunFailed, UsageError


def _terminate(signum, frame):  # scancel / qdel / walltime send SIGTERM first: record the run as failed
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m restart_harness.phases.job RUN_DIR [phase=restart key=value ...]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    from restart_harness import machine, preflight
    from restart_harness.command.parse import parse_restart
    from restart_harness.files.atomic import read_json
    from restart_harness.phases.restart_only import restart_only
    from restart_harness.phases.run import execute, in_job
    from restart_harness.results import terminal

    run_dir = Path(argv[0]).resolve()
    try:
        if argv[1:]:  # a restart-only job: checked again here, then launched directly (we are in the allocation)
            request = parse_restart([*argv[1:], f"run={run_dir}"], machine.complete_in_job)
            preflight.restart(request)
            restart_only(request)
        else:
            execute(in_job(run_dir))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("terminated", file=sys.stderr)
        return 143
    print(terminal.render(read_json(run_dir / "summary.json")))
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
