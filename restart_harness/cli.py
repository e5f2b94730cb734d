"""`./submit-job.sh [COMMAND] ...`: parse and validate (command/), complete the spec against this machine
(machine.py), check the machine and resolve the run's plug-ins (preflight.py, resolve.py), then act. Every user
mistake is one line on stderr and exit code 2, before anything is created.

Each command is one row of COMMANDS: how its words become a checked request (everything that can refuse it), and
what it does with it."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from restart_harness import machine, preflight, resolve
from restart_harness.command import parse
from restart_harness.command.help import TOPICS, command_usage, usage
from restart_harness.errors import UsageError, exit_code, refused
from restart_harness.spec import environment

HELP = ("-h", "--help")


def _help_wanted(argv: list[str]) -> str | None:
    """`--help` / `help`: all; `CMD --help` / `help CMD`: that command's; `MODEL --help`: a run's (a sweep's with a
    comma list); any other word with a help word: refused, naming it and the commands."""
    if argv and argv[0] in HELP or argv == ["help"]:
        return "all"
    if argv and argv[0] == "help":
        if argv[1] not in TOPICS:
            raise UsageError(f"help {argv[1]}: no such command; commands: {', '.join(TOPICS)}")
        return argv[1]
    if not any(a in HELP for a in argv[1:]):
        return None
    if argv[0] in TOPICS:
        return argv[0]
    words = [a for a in argv if a not in HELP]
    try:
        if "=" not in argv[0]:  # `key=value --help`: a run's keys
            parse.load_model(argv[0].split(",")[0])
    except (UsageError, OSError):
        word = argv[0] if len(argv[0]) <= 80 else f"a first argument of {len(argv[0]):,} characters"
        raise UsageError(f"{word} --help: neither a command nor a MODEL; commands: {', '.join(TOPICS)}; models: "
                         f"{', '.join(parse.preset_names())}, a .yaml preset or an HF config.json") from None
    return "sweep" if parse.is_sweep(words) else "run"


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
    try:
        if wanted := _help_wanted(argv):
            print(usage() if wanted == "all" else command_usage(wanted))
            return 0
        environment.read()  # RH_FAULT, RH_STRACE, ...: a bad value is refused here, for every command
        name, tokens = parse.split_command(argv)
        if name == "run" and parse.is_sweep(tokens):
            name = "sweep"
        command = COMMANDS[name]
        try:
            request = command.check(tokens)
        except OSError as exc:  # a path the checks could not resolve (each path is checked first: the net under it)
            raise UsageError(f"{exc.filename or ' '.join(tokens)}: cannot be used ({exc.strerror or exc})") from None
        return exit_code(lambda: command.act(request)) if command.launches else command.act(request)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


@dataclass(frozen=True)
class Command:
    check: Callable  # tokens -> request, every refusal (UsageError) made before anything is created
    act: Callable  # request -> exit code
    launches: bool = False  # it starts ranks: SIGTERM ends it like Ctrl-C, a failed run is one line and exit 1


# ---- run, sweep, restart -----------------------------------------------------------------------------------------
def _check_sweep(tokens: list[str]):
    request = parse.parse_sweep(tokens)
    request.combos = [dataclasses.replace(c, spec=machine.resolve(c.spec)) for c in request.combos]
    for combo in request.combos:
        combo.plugins = preflight.run(combo.spec)
    if len({c.spec.results_dir for c in request.combos}) > 1:
        raise refused("results_dir", ",".join(sorted({c.spec.results_dir for c in request.combos})),
                      "a sweep writes into one folder", "one results_dir")
    return request


def _check_restart(tokens: list[str]):
    request = parse.parse_restart(tokens, machine.complete_in_job)
    return dataclasses.replace(request, integrity=preflight.restart(request))


def _print_run(run_dir: Path, submitted: bool) -> int:
    from restart_harness.files.atomic import read_json
    from restart_harness.results import goodput, terminal

    if not submitted and (run_dir / "summary.json").is_file():  # a submitted job's results come when it has run
        summary = read_json(run_dir / "summary.json")
        print(terminal.render(summary))
        # the checkpoint interval this run's measured save and restart costs call for (summary.json's `goodput`)
        for i, o in enumerate(summary.get("goodput") or []):
            if not i:
                print(f"{'goodput':<19}failures at {o['mtbf_source']}, docs/goodput.md")
            print(f"{'':<19}{goodput.line(o)}")
    print(run_dir)
    return 0


def _run(plugins) -> int:
    from restart_harness.phases.run import run

    return _print_run(run(plugins), submitted=False)


def _restart(request) -> int:
    from restart_harness.phases.run import restart_only

    return _print_run(restart_only(request), submitted=request.run.launcher.submits())


def _sweep(request) -> int:
    from restart_harness.campaigns import outcome, sweep
    from restart_harness.files.atomic import read_json

    sweep_dir = sweep.run(request)
    summary = read_json(sweep_dir / "sweep.json")
    print(sweep.render(summary))
    print(sweep_dir)
    return outcome.exit_code(r["state"] for r in summary["runs"])


# ---- commands that launch nothing, and the campaigns -----------------------------------------------------------------
def _check_plan(tokens: list[str]):
    request = parse.parse_plan(tokens)
    return request, resolve.plugins(request.spec)


def _plan(checked) -> int:
    from restart_harness.plan import estimate

    request, plugins = checked
    plan = estimate.build(plugins, request.options.bandwidth_gbps, request.target)
    print(json.dumps(plan, indent=1) if request.options.plan == "json"
          else estimate.render(plan, files=request.options.detail == "files"))
    return 0


def _check_predict(tokens: list[str]):
    request = parse.parse_predict(tokens)
    spec = request.spec
    if spec.device == "auto":  # as a run resolves it, without the run's checks of this node's resources
        spec = dataclasses.replace(spec, device="cuda" if machine.nvidia_devices() else "cpu")
    return resolve.plugins(spec), request.options


def _predict(checked) -> int:
    from restart_harness.predict import forecast

    plugins, options = checked
    store = forecast.storage(plugins, options.write_gbps, options.read_gbps, metadata_ops_s=options.metadata_ops_s,
                             env_metadata_ops_s=options.env_metadata_ops_s)
    prediction = forecast.build(plugins, options.cpus_per_node or os.cpu_count() or 1, store,
                                crossover_range=(options.crossover_min_bytes, options.crossover_max_bytes))
    print(json.dumps(prediction, indent=1) if options.predict == "json" else forecast.render(prediction))
    return 0


def _check_calibrate(tokens: list[str]):
    from restart_harness.files.fsfacts import why_unresolvable

    options = machine.paths(parse.parse_options("calibrate", tokens))
    for folder in options.runs.split(","):
        if why := why_unresolvable(folder) or (None if Path(folder).expanduser().exists() else "no such directory"):
            raise refused("runs", options.runs, f"{folder}: {why}", "finished run directories, or folders of them")
    preflight.output_file("out", options.out)
    from restart_harness.predict import fit

    base = fit.load(options.base, "base") if options.base else None
    return options, fit.calibrate([Path(p) for p in options.runs.split(",") if p], options.device, base)


def _calibrate(checked) -> int:
    from restart_harness.predict import fit

    options, calibration = checked
    print(fit.render(calibration))
    try:
        print(fit.write(calibration, Path(options.out)))
    except FileExistsError:
        print(f"error: out={options.out}: written by another process meanwhile; kept as it is (nothing is "
              "overwritten)", file=sys.stderr)
        return 1
    return 0


def _check_baseline(tokens: list[str]):
    options = machine.paths(parse.parse_options("baseline", tokens))
    preflight.baseline(options)
    return options


def _baseline(options) -> int:
    from restart_harness.files import baseline

    ranks = options.ranks or min(os.cpu_count() or 1, baseline.AUTO_MAX_RANKS)
    probe = resolve.target_at(options.dir, key="dir").storage_probe()
    try:
        record = baseline.measure(probe, options.file_bytes, ranks, options.tool)
    except Exception as exc:  # noqa: BLE001 - a probe failing on the storage (OSError, the S3 client's errors)
        print(f"error: baseline of {options.dir} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(baseline.render(record, baseline.cache_path(probe, options.file_bytes, ranks)))
    return 0


def _check_clean(tokens: list[str]):
    options = machine.paths(parse.parse_options("clean", tokens))
    if not Path(options.folder).expanduser().is_dir():
        raise UsageError(f"folder={options.folder}: no such directory; accepted: a folder of runs (results)")
    return options


def _clean(options) -> int:
    from restart_harness.results import clean
    from restart_harness.schema import count

    found, problems, left = clean.candidates(Path(options.folder).expanduser(), options.older_than_hours,
                                             options.larger_than, options.prefix)
    for problem in problems:
        print(f"skipped {problem}", file=sys.stderr)
    verb = "deleted" if options.apply else "would delete"
    for c in found:
        if options.apply:
            clean.delete(c)
        print(f"{verb} {clean.line(c)}")
    total = sum(c.bytes for c in found)
    print(f"{verb} the checkpoints of {count(len(found), 'finished run')}, {total / 2**30:,.2f} GiB in all; their "
          "results (spec, summary, events, logs) are kept" + ("" if options.apply else "; apply=true deletes them"))
    if left:
        print("left alone: " + ", ".join(f"{count(n, 'run')} {why}" for why, n in sorted(left.items())))
    return 0


def _report(tokens: list[str]) -> int:
    from analysis.report import main as report

    return report(tokens)


def _check_matrix(tokens: list[str]):
    from restart_harness.campaigns import matrix

    options = machine.paths(parse.parse_matrix(tokens))
    preflight.directory("results_dir", options.results_dir)
    matrix.device_of(options)  # device=cuda without a device: refused before anything is created
    return options


def _matrix(options) -> int:
    from restart_harness.campaigns import matrix

    folder = matrix.run(options)
    print(folder)
    return matrix.exit_code(folder)


def _check_mlperf(tokens: list[str]):
    from restart_harness.campaigns import mlperf

    request = parse.parse_mlperf(tokens)
    if request.spec is not None:
        request.spec = machine.resolve(request.spec)
        request.plugins = preflight.run(request.spec, fixed_layout=f"the workload {request.workload.name}")
        mlperf.check(request)
    return mlperf, request


def _check_study(tokens: list[str]):
    from restart_harness.campaigns import study

    return study, study.check(parse.parse_study(tokens))


def _check_endure(tokens: list[str]):
    from restart_harness.campaigns import endure

    return endure, endure.check(tokens)


def _campaign(checked) -> int:
    """mlperf, study, endure: the campaign's module runs what its check returned."""
    campaign, request = checked
    return campaign.main(request)


COMMANDS: dict[str, Command] = {
    "run": Command(lambda tokens: preflight.run(machine.resolve(parse.parse_run(tokens)[0])), _run, launches=True),
    "sweep": Command(_check_sweep, _sweep, launches=True),
    "restart": Command(_check_restart, _restart, launches=True),
    "plan": Command(_check_plan, _plan),
    "predict": Command(_check_predict, _predict),
    "calibrate": Command(_check_calibrate, _calibrate),
    "baseline": Command(_check_baseline, _baseline),
    "clean": Command(_check_clean, _clean),
    "report": Command(lambda tokens: tokens, _report),  # analysis/report.py refuses its own mistakes (exit 2)
    "matrix": Command(_check_matrix, _matrix, launches=True),
    "mlperf": Command(_check_mlperf, _campaign, launches=True),
    "study": Command(_check_study, _campaign, launches=True),
    "endure": Command(_check_endure, _campaign, launches=True)}
