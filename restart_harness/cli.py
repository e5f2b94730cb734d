"""`./submit-job.sh [COMMAND] ...`: parse and validate (command/), complete the spec against this machine
(machine.py), check the machine (preflight.py), then act. Every user mistake is one line on stderr and exit code 2,
before anything is created."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from restart_harness.errors import RunFailed, UsageError


def _terminate(signum, frame):  # SIGTERM ends a run like Ctrl-C: ranks killed, run recorded as failed
    raise KeyboardInterrupt


HELP = ("-h", "--help")


def _help_wanted(argv: list[str]) -> str | None:
    """`--help` / `help`: all; `CMD --help` / `help CMD`: that command's (report answers its own)."""
    from restart_harness.command.parse import COMMANDS

    if argv and argv[0] == "help":
        return argv[1] if len(argv) > 1 and argv[1] in COMMANDS and argv[1] != "report" else "all"
    if argv and argv[0] in HELP:
        return "all"
    if len(argv) > 1 and argv[0] in COMMANDS and argv[0] != "report" and any(a in HELP for a in argv[1:]):
        return argv[0]
    if len(argv) > 1 and any(a in HELP for a in argv[1:]):
        return "run"
    return None


def main(argv: list[str] | None = None) -> int:
    """The command line; output into a pipe that closed early (`plan ... | head`) ends it quietly, as Unix tools do."""
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # whatever is still buffered would raise again when Python flushes at exit: send it nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a tool ended by a closed pipe


def _main(argv: list[str]) -> int:
    if wanted := _help_wanted(argv):
        from restart_harness.command.help import command_usage, usage

        print(usage() if wanted == "all" else command_usage(wanted))
        return 0
    import dataclasses

    from restart_harness import machine, preflight
    from restart_harness.command import parse as command

    try:
        name, tokens = command.split_command(argv)
        if name == "report":
            from analysis.report import main as report

            return report(tokens)
        if name == "baseline":
            options = command.parse_baseline(tokens)
            preflight.baseline(options)
            return _baseline(options)
        if name == "plan":
            request = command.parse_plan(tokens)
            return _plan(request)
        if name == "predict":
            request = command.parse_predict(tokens)
            spec = request.spec
            if spec.device == "auto":  # as a run resolves it, without the run's checks of this node's resources
                spec = dataclasses.replace(spec, device="cuda" if machine.nvidia_devices() else "cpu")
            return _predict(spec, request.options)
        if name == "clean":
            options = command.parse_clean(tokens)
            if not Path(options.folder).expanduser().is_dir():
                raise UsageError(f"folder={options.folder}: no such directory; accepted: a folder of runs (results)")
            return _clean(options)
        if name == "calibrate":
            options = command.parse_calibrate(tokens)
            preflight.output_file("out", options.out)
            return _calibrate(options)
        if name == "matrix":
            from restart_harness.launch import matrix

            options = command.parse_matrix(tokens)
            matrix.device_of(options)  # device=cuda without a device: refused before anything is created
            folder = matrix.run(options)
            print(folder)
            return 0 if matrix.ok(folder) else 1
        if name == "mlperf":
            from restart_harness.launch import mlperf

            request = command.parse_mlperf(tokens)
            if request.spec is not None:
                request.spec = machine.resolve(request.spec)
                preflight.run(request.spec, fixed_layout=f"the workload {request.workload.name}")
                mlperf.check(request)
            return _mlperf(request)
        if name == "restart":
            request = command.parse_restart(tokens)
            request = dataclasses.replace(request, integrity=preflight.restart(request))
        elif command.is_sweep(tokens):
            request = command.parse_sweep(tokens)
            request.combos = [dataclasses.replace(c, spec=machine.resolve(c.spec)) for c in request.combos]
            for combo in request.combos:
                preflight.run(combo.spec)
            if len({c.spec.results_dir for c in request.combos}) > 1:
                raise UsageError("results_dir=: a sweep writes into one folder")
            name = "sweep"
        else:
            request = machine.resolve(command.parse_run(tokens)[0])
            preflight.run(request)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _execute(name, request)


def _baseline(options) -> int:
    import os

    from restart_harness import targets
    from restart_harness.storage import baseline

    ranks = options.ranks or min(os.cpu_count() or 1, baseline.AUTO_MAX_RANKS)
    target = targets.for_location(options.dir, ".")
    try:
        record = baseline.measure(target, options.file_bytes, ranks, options.tool)
    except Exception as exc:  # noqa: BLE001 - a probe failing on the storage (OSError, the S3 client's errors)
        print(f"error: baseline of {options.dir} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(baseline.render(record, baseline.cache_path(target, options.file_bytes, ranks)))
    return 0


def _guarded(work) -> int:
    """Run work() (it launches ranks): SIGTERM ends it like Ctrl-C; a failed run is one line and exit 1."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return work()
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _mlperf(request) -> int:
    from restart_harness.launch import mlperf

    return _guarded(lambda: mlperf.main(request))


def _plan(request) -> int:
    import json

    from restart_harness.plan import estimate

    plan = estimate.build(request.spec, request.options.bandwidth_gbps, request.target)
    print(json.dumps(plan, indent=1) if request.options.plan == "json"
          else estimate.render(plan, files=request.options.detail == "files"))
    return 0


def _predict(spec, options) -> int:
    import json
    import os

    from restart_harness.predict import forecast

    store = forecast.storage(spec, options.write_gbps, options.read_gbps, metadata_ops_s=options.metadata_ops_s,
                             env_metadata_ops_s=options.env_metadata_ops_s)
    prediction = forecast.build(spec, options.cpus_per_node or os.cpu_count() or 1, store)
    print(json.dumps(prediction, indent=1) if options.predict == "json" else forecast.render(prediction))
    return 0


def _clean(options) -> int:
    from restart_harness.results import clean

    found, problems = clean.candidates(Path(options.folder).expanduser(), options.older_than_hours,
                                       options.larger_than, options.prefix)
    for problem in problems:
        print(f"skipped {problem}", file=sys.stderr)
    verb = "deleted" if options.apply else "would delete"
    for c in found:
        if options.apply:
            clean.delete(c)
        print(f"{verb} {clean.line(c)}")
    total = sum(c.bytes for c in found)
    print(f"{verb} the checkpoints of {len(found)} finished runs, {total / 2**30:,.2f} GiB in all; their results "
          "(spec, summary, events, logs) are kept" + ("" if options.apply else "; apply=true deletes them"))
    return 0


def _calibrate(options) -> int:
    from pathlib import Path

    from restart_harness.predict import fit

    calibration = fit.calibrate([Path(p) for p in options.runs.split(",") if p])
    out = fit.write(calibration, Path(options.out))
    print(fit.render(calibration))
    print(out)
    return 0


def _execute(name: str, request) -> int:
    from restart_harness import launchers
    from restart_harness.launch import runner, sweep
    from restart_harness.results import terminal
    from restart_harness.storage.atomic import read_json

    def work() -> int:
        if name == "sweep":
            sweep_dir = sweep.run(request)
            summary = read_json(sweep_dir / "sweep.json")
            print(sweep.render(summary))
            print(sweep_dir)
            return 0 if all(r["state"] in ("complete", "submitted", "dry_run") for r in summary["runs"]) else 1
        run_dir = runner.restart_only(request) if name == "restart" else runner.run(request)
        submitted = name == "restart" and launchers.of(request.spec).submits()  # the results come when the job has run
        if not submitted and (run_dir / "summary.json").is_file():
            print(terminal.render(read_json(run_dir / "summary.json")))
        print(run_dir)
        return 0

    return _guarded(work)
