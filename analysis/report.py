#!/usr/bin/env python3
"""./analysis/report.py RUN_OR_SWEEP_DIR... [out_dir=REPORT_DIR] [include=failed,dry] [match=GLOB] (also python -m
analysis, ./submit-job.sh report): a report folder of the runs and studies found (docs/analysis.md)."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

try:
    from analysis import goodput as gp
    from analysis import load as ld
    from analysis import plots, render
    from analysis import study as st
    from analysis import table as tb
    from analysis.layout import png_bytes, pngs  # noqa: F401  png_bytes: for the notebook
    from restart_harness.command.report import parse_report
    from restart_harness.errors import UsageError, refused
    from restart_harness.files.exclusive import claim_dir, create_file
    from restart_harness.files.fsfacts import why_not_a_directory, why_unresolvable
    from restart_harness.schema import STUDY, count
except ImportError as exc:  # run as ./analysis/report.py by a Python without the project or matplotlib
    sys.exit(f"error: {exc}: this Python ({sys.executable}) lacks the restart-harness package or matplotlib; use "
             "./submit-job.sh report ..., or pip install -e '.[analysis]' into it")


def parse(argv: list[str]) -> tuple[list[str], Path | None, tuple[str, ...], str | None]:
    """(paths, report folder, include, match) through the harness's one parser (command/report.py parse_report);
    UsageError on a mistake."""
    request = parse_report(argv)
    out = request.options.out_dir
    for key, value in [("out_dir", out), *(("RUN_OR_SWEEP_DIR", p) for p in request.paths)]:
        if value is not None and (why := why_unresolvable(value)):
            raise UsageError(f"{key}={value}: {why}")
    include = tuple(w for w in request.options.include.split(",") if w)
    if unknown := [w for w in include if w not in ld.INCLUDE]:
        raise UsageError(f"include={unknown[0]}: accepted: {', '.join(ld.INCLUDE)} (comma-separated)")
    output = Path(out).expanduser() if out else None
    if output is not None and taken(output):
        raise refused("out_dir", output, "already exists and is not an empty folder", "a new one")
    if output is not None and (why := why_not_a_directory(output)):
        raise refused("out_dir", output, why, "a folder that can be created")
    return request.paths, output, include, request.options.match


def taken(folder: Path) -> bool:
    """Whether folder holds something already (a report is never written over anything)."""
    return folder.exists() and (not folder.is_dir() or any(folder.iterdir()))


def report_dir(requested: Path | None) -> Path:
    """The report folder, created here; an earlier report is never overwritten."""
    if requested is None:
        return claim_dir(Path("reports"), f"report-{datetime.now():%Y%m%d-%H%M%S}")
    if taken(requested):
        raise FileExistsError(f"{requested} already exists and is not an empty folder; give a new one")
    requested.mkdir(parents=True, exist_ok=True)
    return requested.resolve()


def build(runs: list[ld.Run], skipped: list[ld.Skipped], failures: list[ld.SweepFailure],
          campaigns: list[dict] | None = None) -> dict:
    """Everything the report holds: rows, groups, tables and figures (nothing written yet); campaigns: the failure
    campaigns (endure.json) found, on the goodput figure."""
    rows = tb.rows(runs)
    phases = [p for p in tb.phase_names(runs) if any(r.get(f"phase_{p}_seconds") is not None for r in rows)]
    groups = tb.groups(runs, rows)
    figures = plots.all_figures(groups, phases)
    figures["goodput_by_checkpoint_interval_seconds"] = gp.figure(campaigns or [], groups)
    tables = [render.configurations(groups), render.phases_table(groups, phases),
              *(t(groups) for t in (render.anatomy_table, render.stragglers_table, render.memory_table,
                                    render.io_table, render.reshard_table, render.prediction_table,
                                    render.crossover_table)),
              render.nodes_table(runs), render.runs_table(rows), render.baseline_table(rows),
              render.problems_table(skipped, runs, failures)]
    return {"rows": rows, "saves": tb.save_rows(runs), "groups": groups, "figures": figures,
            "tables": [t for t in tables if t]}


def with_studies(built: dict, studies: list[Path]) -> dict:
    """A study folder among the inputs: its table's section (analysis/study.py) first in the report."""
    tables, made, missing = [], {}, []
    for folder in studies:
        try:
            t, p, m = st.section(folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a torn or foreign study.json: named, skipped
            print(f"skipped {folder}: its {STUDY} cannot be read ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        tables += t
        made.update(p)
        missing += m
    return {**built, "tables": tables + built["tables"], "study_pngs": made, "study_missing": missing}


def write(out: Path, built: dict, title: str) -> list[Path]:
    """The report files under out; returns them."""
    made, missing = pngs(built["figures"])
    files = {"runs.csv": tb.to_csv(built["rows"]).encode(), "saves.csv": tb.to_csv(built["saves"]).encode(),
             **render.documents("report", title, built["tables"], {**built.get("study_pngs", {}), **made},
                                missing + built.get("study_missing", []))}
    for name, data in files.items():
        create_file(out / name, data)  # a file another report wrote there meanwhile is kept: FileExistsError
    return [out / name for name in files]


def left_out(counts: dict[str, int], match: str | None) -> str:
    """The line naming the runs include= and match= left out; "" when none."""
    if not counts:
        return ""
    words = {"failed": "failed or interrupted", "dry": "dry", "not matching": f"not matching {match}"}
    said = ", ".join(f"{n} {words[k]}" for k, n in sorted(counts.items()))
    hint = [k for k in ld.INCLUDE if k in counts]
    return f"left out: {said} run(s)" + (f" (include={','.join(hint)} takes them in)" if hint else "")


def say(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """The report; a mistake is one line on stderr and exit code 2, before anything is written."""
    try:
        paths, output, include, match = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    loaded = ld.load(paths, include=include, match=match)
    runs, skipped, left = loaded.runs, loaded.skipped, left_out(loaded.left_out, match)
    studies = [Path(p) for p in paths if (Path(p) / STUDY).is_file()]
    if not runs and not studies:  # one line: what was found instead of a readable run
        found = "; ".join([*([left] if left else []), *(s.line() for s in skipped)])
        say([f"error: no readable run in {' '.join(map(str, paths))}" + (f" ({found})" if found else "")
             + "; nothing written"])
        return 2
    say([*([left] if left else []), *(s.line() for s in skipped)])
    for r in runs:
        say([f"note {r.dir}: {note}" for note in r.notes])
        if r.state != "complete":
            reason = tb.get(r.summary, "status", "reason", default="no reason given")
            say([f"run {r.dir} is {r.state} ({reason}): in runs.csv, left out of the plots"])
    failures = ld.sweep_failures([Path(p) for p in paths], runs)
    say([f"sweep {f.sweep}: combination {f.combination} {f.state}: {f.reason}" for f in failures])
    built = build(runs, skipped, failures, gp.campaigns(paths)) if runs else {
        "rows": [], "saves": [], "groups": [], "figures": {}, "tables": []}
    built = with_studies(built, studies)
    if not runs and not built["tables"]:
        say([f"error: no readable run or study in {' '.join(map(str, paths))}; nothing written"])
        return 2
    try:
        out = report_dir(output)
    except OSError as exc:
        say([f"error: cannot create the report folder: {exc}"])
        return 2
    n_restarts, n_groups = sum(1 for r in built["rows"] if r.get("restart_record")), len(built["groups"])
    title = (f"Restart-harness report: {count(len(runs), 'run')}, {count(n_restarts, 'restart')}, "
             f"{count(n_groups, 'configuration')}" + (f", {count(len(studies), 'study', 'studies')}" if studies else ""))
    try:
        written = write(out, built, title)
    except FileExistsError as exc:
        say([f"error: {exc.filename}: written by another process meanwhile; kept as it is, this report stopped"])
        return 1
    print(f"{count(len(runs), 'run')} ({count(n_restarts, 'restart record')}) in {count(n_groups, 'configuration')}; "
          f"{len(skipped)} skipped; wrote {', '.join(p.name for p in written)}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
