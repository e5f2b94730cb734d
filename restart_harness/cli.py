"""`config-n-run.py MODEL key=value ...`: validate, run, summarize. User mistakes: one line, exit code 2.

Shapes of command line, each validated completely before anything is written:
  MODEL key=value ...                 one run (phase=all or phase=checkpoint; dry_run=true writes only)
  MODEL key=value ... plan=true|json  the checkpoint's files and sizes, predicted; nothing launched
  baseline dir=PATH [...]             measure the storage (restart_harness/launch/baseline.py)
  MODEL key=a,b ... [repeats=N]       a sweep: the product of the lists, each run in one sweep folder
  phase=restart run=RUN_DIR [...]     restart-only re-runs of an existing run (restart_harness/spec/phases.py)
"""

from __future__ import annotations

import signal
import sys

from restart_harness.errors import RunFailed, UsageError


def _terminate(signum, frame):  # SIGTERM ends a run like Ctrl-C: ranks killed, run recorded as failed
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help", "help"):
        from restart_harness.spec.help import usage

        print(usage())
        return 0
    from restart_harness.launch import launchers, sweep
    from restart_harness.spec import parse_args
    from restart_harness.spec.phases import parse_restart, wants_restart

    try:
        if argv and argv[0] == "baseline":
            from restart_harness.launch import baseline

            return baseline.main(argv[1:])
        from restart_harness.plan import report

        plan_mode, bandwidth, argv = report.split_plan_tokens(argv)
        if plan_mode:  # a plan needs no engine runnable here
            return report.print_plan(parse_args(argv, check_engine=False), plan_mode, bandwidth)
        if wants_restart(argv):
            mode, request = "restart", parse_restart(argv)
        elif sweep.is_sweep(argv):
            mode, request = "sweep", sweep.plan(argv)
        else:
            mode, request = "run", parse_args(argv)
            launchers.check(request)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    from restart_harness.launch import runner
    from restart_harness.results import table
    from restart_harness.results.atomic import read_json

    try:
        if mode == "sweep":
            sweep_dir = sweep.run(argv, *request)
            summary = read_json(sweep_dir / "sweep.json")
            print(sweep.render(summary))
            print(sweep_dir)
            return 0 if all(r["state"] in ("complete", "submitted", "dry_run") for r in summary["runs"]) else 1
        run_dir = runner.restart_only(request) if mode == "restart" else runner.run(request)
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if (run_dir / "summary.json").is_file():
        print(table.render(read_json(run_dir / "summary.json")))
    print(run_dir)
    return 0
