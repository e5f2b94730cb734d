"""`./submit-job.sh --help`: the commands, every key grouped with its type, default, unit and meaning (from the
declarations the parser uses), then presets, training stacks, storage targets and engines."""

from __future__ import annotations

from engines import registry
from restart_harness import launchers, stacks, targets
from restart_harness.command.options import (
    ENDURE_FIXED,
    MLPERF_FIXED,
    STUDY_FIXED,
    BaselineOptions,
    CalibrateOptions,
    CleanOptions,
    EndureOptions,
    MatrixOptions,
    MlperfOptions,
    PlanOptions,
    PredictOptions,
    RestartOptions,
    StudyOptions,
)
from restart_harness.command.parse import restart_keys
from restart_harness.command.report import ReportOptions
from restart_harness.spec.keys import GROUPS, UNITS, describe, keys_of
from restart_harness.spec.model_shape import preset_names, shape_keys
from restart_harness.spec.runspec import run_keys

USAGE = """\
usage: ./submit-job.sh [run] MODEL [key=value ...]          train, checkpoint, restart in fresh processes, verify
       ./submit-job.sh MODEL key=a,b [key=c,d ...] [repeats=N]   a sweep: every combination, one folder
       ./submit-job.sh plan MODEL [key=value ...]            the checkpoint a run would write; launches nothing
       ./submit-job.sh predict MODEL [key=value ...]         save and restart seconds a run would take; launches nothing
       ./submit-job.sh calibrate runs=DIR out=FILE           fit the prediction model to finished runs
       ./submit-job.sh restart run=RUN_DIR [key=value ...]   restart-only re-runs of an earlier run
       ./submit-job.sh baseline dir=PATH [key=value ...]     storage: sequential write+fsync and cold read
       ./submit-job.sh report RUN_OR_SWEEP_DIR... [key=value]   runs.csv, report.md/.html and plots (analysis/)
       ./submit-job.sh matrix [key=value ...]                every engine x layouts that fit the node, verified
       ./submit-job.sh mlperf [WORKLOAD] [key=value ...]     an MLPerf Storage checkpoint workload, MLPerf's metrics
       ./submit-job.sh clean [key=value ...]                 delete finished runs' checkpoints, keep their results
       ./submit-job.sh study [key=value ...]                 models x strategies x engines: files, sizes, save, restart
       ./submit-job.sh endure MODEL duration=T mtbf=T [key=value ...]   failures at random while it trains: goodput
(older spellings: `phase=restart run=DIR`, `MODEL ... plan=true|json`)

MODEL: {presets} (configs/models/), a .yaml preset, or a local HF config.json (or its folder)
"""


def _section(title: str, keys: list) -> list[str]:
    return [f"{title}:", *(f"  {describe(k)}" for k in keys), ""]


def _groups():
    """(group, its run keys, the model's shape keys with `model`), for the groups that have keys."""
    run = run_keys()
    for group in GROUPS:
        keys = [k for k in run.values() if k.group == group] + (list(shape_keys().values()) if group == "model" else [])
        if keys:
            yield group, keys


def _run_sections() -> list[str]:
    return [line for group, keys in _groups() for line in _section(f"{group} keys", keys)]


def _plugin_sections() -> list[str]:
    lines = ["training stacks (stack=NAME):"]
    lines += [f"  {name}: {cls.description}" for name, cls in stacks.all_stacks().items() if name in stacks.names()]
    lines += ["", "launchers (launcher=NAME):"]
    lines += [f"  {name}" + "".join(f" (or {a})" for a in cls.aliases) + f": {cls.description}"
              for name, cls in launchers.all_launchers().items()]
    lines += ["", "storage targets (chosen by ckpt_dir):"]
    lines += [f"  {name}: {cls.description}" for name, cls in targets.all_targets().items()]
    lines += ["", "engines (engine=NAME) and their options (keys too):"]
    for name, cls in registry.all_engines().items():
        lines.append(f"  {name}: {cls.description}")
        lines += [f"      {describe(k)}" for k in keys_of(cls.Options).values()]
    return lines


# each command other than a run: (its options, whether it takes a run's keys too, the words after it in its usage)
_COMMAND_KEYS = {"plan": (PlanOptions, True, ""), "predict": (PredictOptions, True, ""),
                 "calibrate": (CalibrateOptions, False, ""), "baseline": (BaselineOptions, False, ""),
                 "matrix": (MatrixOptions, False, ""), "report": (ReportOptions, False, " RUN_OR_SWEEP_DIR..."),
                 "restart": (RestartOptions, False, ""), "mlperf": (MlperfOptions, False, " WORKLOAD"),
                 "clean": (CleanOptions, False, ""), "study": (StudyOptions, False, ""),
                 "endure": (EndureOptions, True, " MODEL")}


def _run_keys_tail(name: str, run: str, full: bool) -> str | None:
    """What the command takes of the run keys (`run`: how they are named); `full`: the longer words of CMD --help."""
    except_shape = "except {} and the model's shape"
    if name == "restart":
        return f"and of {run}: {', '.join(restart_keys())}"
    if name == "mlperf":
        return f"and {run} {except_shape.format(', '.join(MLPERF_FIXED))}" + ("" if full else " (the workload's)")
    if name == "study":
        return ("and the predict keys but predict=" + (" (write_gbps=, read_gbps=, ...: the storage the predictions "
                "assume)" if full else "") + f", and {run} {except_shape.format(', '.join(STUDY_FIXED))}"
                + ("" if full else " (each cell's)"))
    if name == "endure" and not full:
        return f"and {run} except {', '.join(f'{k}=' for k in ENDURE_FIXED)}"
    return "and every run key: ./submit-job.sh run --help" if full and _COMMAND_KEYS[name][1] else None


def usage() -> str:
    lines = [USAGE.format(presets=", ".join(preset_names())), f"units: {UNITS}", "", *_run_sections()]
    for name in ("plan", "predict", "calibrate", "baseline", "matrix", "report", "restart", "clean", "mlperf",
                 "study", "endure"):
        options, _, words = _COMMAND_KEYS[name]
        section = _section(f"{name} keys (with `{name}{words}`)", list(keys_of(options).values()))
        tail = _run_keys_tail(name, "the run keys above", full=False)
        lines += [*section[:-1], f"  {tail}", ""] if tail else section
    return "\n".join(lines + _plugin_sections())


TOPICS = ("run", "sweep", *_COMMAND_KEYS)  # what `CMD --help` and `help CMD` explain


def command_usage(name: str) -> str:
    """`./submit-job.sh CMD --help` (or `help CMD`): the command's usage line and the keys it takes."""
    word = {"run": "[run]", "sweep": "MODEL"}.get(name, name)  # its lines of USAGE: `run` is `[run] MODEL`
    synopsis = [line.replace("usage: ", "").strip() for line in USAGE.splitlines()
                if line.partition("./submit-job.sh ")[2].startswith(word + " ")]
    lines = ["usage: " + "\n       ".join(synopsis), ""]
    if name in ("run", "sweep"):
        lines += [USAGE.splitlines()[-1].format(presets=", ".join(preset_names())), f"units: {UNITS}", ""]
    if name == "sweep":
        single = [k.name for k in run_keys().values() if not k.sweep]
        return "\n".join(lines + [
            ("every run key takes a comma list (key=a,b: one run per value, every combination of the lists), and so "
            f"does MODEL; repeats=N runs each combination N times; one value only: {', '.join(single)}"),
            "the run keys: ./submit-job.sh run --help", ""])
    if name == "run":
        return "\n".join(lines + _run_sections() + _plugin_sections()) + "\n"
    lines += _section(f"{name} keys", list(keys_of(_COMMAND_KEYS[name][0]).values()))
    tail = _run_keys_tail(name, "the run keys (./submit-job.sh run --help)", full=True)
    return "\n".join(lines + ([tail] if tail else [])).rstrip() + "\n"


def markdown() -> str:
    """docs/keys.md: the same declarations as tables (tests/test_structure.py keeps the file equal to this)."""

    def table(keys: list) -> list[str]:
        rows = ["| key | type | default | unit | meaning |", "|---|---|---|---|---|"]
        for k in keys:
            default = k.default_text
            kind = k.type_name.replace("|", r"\|") + (" (" + r" \| ".join(k.choices) + ")" if k.choices else "")
            flags = [f for f, on in (("restart", k.restart), ("no sweep list", not k.sweep)) if on]
            extra = f" *[{', '.join(flags)}]*" if flags else ""
            rows.append(f"| `{k.name}` | {kind} | `{default}` | {k.unit or ''} | {k.help}{extra} |")
        return rows + [""]

    lines = ["# Every key", "",
             ("Generated from the declarations (`python -m restart_harness.command.help > docs/keys.md`); the parser, "
             "`--help` and this page read the same ones. *restart*: a restart-only re-run may set it; *no sweep "
             "list*: one value per sweep."), "", f"Units: {UNITS}.", ""]
    for group, keys in _groups():
        lines += [f"## {group}", "", *table(keys)]
    for name, (options, _, words) in _COMMAND_KEYS.items():
        lines += [f"## {name} (`./submit-job.sh {name}{words} ...`)", "", *table(list(keys_of(options).values()))]
    lines += ["## launchers", "", "| launcher= | what starts the ranks |", "|---|---|"]
    lines += [f"| `{name}`" + "".join(f" (or `{a}`)" for a in cls.aliases) + f" | {cls.description} |"
              for name, cls in launchers.all_launchers().items()]
    lines += ["", "## engine options", ""]
    for name, cls in registry.all_engines().items():
        keys = list(keys_of(cls.Options).values())
        lines += [f"### `engine={name}`", "", cls.description, ""] + (table(keys) if keys else [])
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
