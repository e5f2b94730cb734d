"""`report RUN_OR_SWEEP_DIR... [key=value]`: the report command's words, for analysis/report.py (which reads result
files without torch, DeepSpeed or YAML: this module imports the key declarations only)."""

from __future__ import annotations

from dataclasses import dataclass

from restart_harness.command.tokens import TOKEN, options_of
from restart_harness.errors import UsageError
from restart_harness.spec.keys import Glob, Path, describe, key, keys_of


@dataclass
class ReportOptions:
    out_dir: Path | None = key(None, "the report folder to create (it must not exist, or be empty); default "
                                     "reports/report-<time>/ in the current folder (-o DIR says the same)",
                               group="report")
    include: str = key("", "also report runs that did not finish: failed (failed, interrupted), dry (dry runs), "
                           "comma-separated; by default only finished runs are, and the others are counted on one "
                           "line", group="report")
    match: Glob | None = key(None, "only runs whose folder name (or path below a folder given) matches this glob, "
                                   "e.g. 'tiny-*' or 'sweep-*/*'", group="report")


@dataclass
class ReportRequest:
    paths: list[str]  # run directories, sweep folders or whole results folders
    options: ReportOptions


def usage(program: str = "./submit-job.sh report") -> str:
    """`python -m analysis --help`: the usage line and every key, as `./submit-job.sh report --help` (command/help.py)
    renders them."""
    return (f"usage: {program} RUN_OR_SWEEP_DIR... [key=value]   runs.csv, report.md/.html and plots (analysis/)\n\n"
            "report keys:\n" + "\n".join(f"  {describe(k)}" for k in keys_of(ReportOptions).values()))


def parse_report(tokens: list[str]) -> ReportRequest:
    """`report RUN_OR_SWEEP_DIR... [out_dir=DIR] [include=failed,dry] [match=GLOB]`; `-o DIR` is out_dir=DIR."""
    paths, keyed, rest = [], [], list(tokens)
    while rest:
        token = rest.pop(0)
        if token in ("-o", "--output"):
            if not rest:
                raise UsageError(f"{token}: needs a folder (-o DIR, or out_dir=DIR)")
            keyed.append(f"out_dir={rest.pop(0)}")
        elif TOKEN.match(token):
            keyed.append(token)
        elif token.startswith("-"):
            raise UsageError(f"{token}: not an option of report; accepted: RUN_OR_SWEEP_DIR... "
                             f"{' '.join(f'{k}=' for k in keys_of(ReportOptions))} (or -o DIR)")
        else:
            paths.append(token)
    options = options_of(ReportOptions, keyed, "report")
    if not paths:
        raise UsageError("report needs a folder: ./submit-job.sh report RUN_OR_SWEEP_DIR... (a run directory, a "
                         "sweep folder or a results folder)")
    return ReportRequest(paths, options)
