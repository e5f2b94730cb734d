"""`config-n-run.py MODEL key=value ...`: validate, run, summarize. User mistakes: one line, exit code 2."""

from __future__ import annotations

import sys

from restart_harness.errors import RunFailed, UsageError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help", "help"):
        from restart_harness.spec.help import usage

        print(usage())
        return 0
    from restart_harness.spec import parse_args

    try:
        if argv and argv[0] == "baseline":
            from restart_harness.launch import baseline

            return baseline.main(argv[1:])
        from restart_harness.plan import report

        plan_mode, bandwidth, argv = report.split_plan_tokens(argv)
        spec = parse_args(argv, check_engine=plan_mode is None)  # a plan needs no engine runnable here
        if plan_mode:
            return report.print_plan(spec, plan_mode, bandwidth)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from restart_harness.launch import runner
    from restart_harness.results import table
    from restart_harness.results.atomic import read_json

    try:
        run_dir = runner.run(spec)
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(table.render(read_json(run_dir / "summary.json")))
    print(run_dir)
    return 0
