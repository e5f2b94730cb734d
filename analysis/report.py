#!/usr/bin/env python3
"""./analysis/report.py RUN_OR_SWEEP_DIR... [out_dir=REPORT_DIR] [include=failed,dry] [match=GLOB] (also python -m
analysis, ./submit-job.sh report): a report folder of the runs and studies found (docs/analysis.md), with its goodput
figure (docs/goodput.md "The report")."""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

try:
    from matplotlib.figure import Figure

    from analysis import load as ld
    from analysis import plots, render
    from analysis import study as st
    from analysis import table as tb
    from analysis.layout import caption, fit, legend, png_bytes, pngs, title  # noqa: F401  png_bytes: for the notebook
    from restart_harness.command.report import parse_report, usage
    from restart_harness.errors import UsageError, refused
    from restart_harness.files.exclusive import claim_dir, create_file
    from restart_harness.files.fsfacts import why_not_a_directory, why_unresolvable
    from restart_harness.results import goodput
    from restart_harness.schema import STUDY, count
except ImportError as exc:  # run as ./analysis/report.py by a Python without the project or matplotlib
    sys.exit(f"error: {exc}: this Python ({sys.executable}) lacks the restart-harness package or matplotlib; use "
             "./submit-job.sh report ..., or pip install -e '.[analysis]' into it")

ENDURE = "endure.json"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def campaigns(paths: list[str]) -> list[dict]:
    """Every finished failure campaign (endure.json with its model's figures) at or below the paths."""
    found = []
    for top in map(Path, paths):
        for path in sorted([top / ENDURE] if (top / ENDURE).is_file() else top.rglob(ENDURE)):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("state") == "complete" and doc.get("model"):
                engine = next((t.split("=", 1)[1] for t in doc["command"] if t.startswith("engine=")), "default")
                found.append({**doc, "engine": engine})
    return found


def _grid(low: float, high: float, n: int = 80) -> list[float]:
    return [low * (high / low) ** (i / (n - 1)) for i in range(n)]


def _curve(ax, color: str, label: str, costs: tuple[float, float, float], mtbf: float, xs: list[float],
           share: float = 1.0) -> None:
    """Expected goodput against the interval at (save, restart, step) costs, times `share`, with its best marked."""
    save, restart, step = costs
    best = goodput.optimum(save, restart, step, mtbf)
    ax.plot(xs, [share * goodput.expected_goodput(x, save, restart, mtbf) for x in xs], color=color, label=label)
    ax.plot([best["best_interval_seconds"]], [share * best["goodput_at_best"]], marker="^", color=color, markersize=7)


def _campaign_panel(ax, found: list[dict]) -> None:
    """Per engine and MTBF: the model at the campaigns' realized failure rate, less the first start-up's share
    (docs/goodput.md), their median costs; each campaign's measured goodput at its interval."""
    series: dict[tuple, list[dict]] = {}
    for doc in found:
        series.setdefault((doc["engine"], doc["mtbf_seconds"]), []).append(doc)
    every = [d["model"]["interval_seconds"] for d in found] + [d["model"]["best_interval_seconds"] for d in found]
    xs = _grid(min(every) / 4, max(every) * 4)
    for i, ((engine, mtbf), docs) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        med = {k: statistics.median(d["model"][k] for d in docs) for k in (
            "save_seconds", "restart_seconds", "realized_mtbf_seconds")}
        step = statistics.median(d["step_seconds_median"] for d in docs)
        share = statistics.median(1 - d["model"]["first_startup_seconds"] / d["wall_seconds"] for d in docs)
        realized = med["realized_mtbf_seconds"]
        _curve(ax, color, f"{engine}, mtbf={mtbf:g} s: model at the realized {realized:.0f} s",
               (med["save_seconds"], med["restart_seconds"], step), realized, xs, share)
        ax.scatter([d["model"]["interval_seconds"] for d in docs], [d["goodput"]["goodput"] for d in docs],
                   color=color, edgecolor="black", zorder=3, label=f"{engine}, mtbf={mtbf:g} s: measured")
    _axes(ax, "goodput (productive share of wall time)", "Failure campaigns: measured goodput beside the model's curve",
          "engine, failure rate")


def _scale_panel(ax, groups: list[tb.Group]) -> None:
    """Each engine's curve at at_gpus= from its first run that measured a save, a restart and a step."""
    engines: dict[str, dict] = {}
    for g in groups:
        for run in g.runs:
            if entries := (run.summary or {}).get("goodput") or []:
                engines.setdefault(g.engine, entries[-1])
    every = [o["best_interval_seconds"] for o in engines.values()]
    xs = _grid(min(every) / 20, max(every) * 20)
    for i, (engine, o) in enumerate(sorted(engines.items())):
        _curve(ax, COLORS[i % len(COLORS)], f"{engine} ({o['gpus']:,} GPUs, MTBF {o['job_mtbf_seconds'] / 3600:.3g} h)",
               (o["save_seconds"], o["restart_seconds"], o["step_seconds"]), o["job_mtbf_seconds"], xs)
    _axes(ax, "expected goodput", "At scale, from the runs' measured save, restart and step", "engine (scale, job MTBF)")


def _axes(ax, ylabel: str, heading: str, legend_title: str) -> None:
    ax.set(xscale="log", xlabel="checkpoint interval (seconds, log scale)", ylabel=ylabel)
    title(ax, heading)
    legend(ax, title=legend_title)


def goodput_figure(found: list[dict], groups: list[tb.Group]) -> Figure | None:
    """Goodput against the checkpoint interval; None where neither a campaign nor a run has the figures."""
    has_runs = any((r.summary or {}).get("goodput") for g in groups for r in g.runs)
    panels = [draw for draw, present in ((lambda ax: _campaign_panel(ax, found), found),
                                         (lambda ax: _scale_panel(ax, groups), has_runs)) if present]
    if not panels:
        return None
    fig = Figure(figsize=(11.0, 1.0 + 5.0 * len(panels)), layout="constrained")
    for ax, draw in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels):
        draw(ax)
    caption(fig, "curves: expected goodput (Daly's model at the campaigns' measured costs, docs/goodput.md); "
                 "triangles: the model's best interval; dots: a failure campaign's measured goodput at its interval")
    return fit(fig)


def parse(argv: list[str]) -> tuple[list[str], Path | None, tuple[str, ...], str | None]:
    """(paths, report folder, include, match) through command/report.py's parser; UsageError on a mistake."""
    request = parse_report(argv)
    out = request.options.out_dir
    for key, value in [("out_dir", out), *(("RUN_OR_SWEEP_DIR", p) for p in request.paths)]:
        if value is not None and (why := why_unresolvable(value)):
            raise UsageError(f"{key}={value}: {why}")
    for path in request.paths:  # a mistyped one is refused, not skipped (a folder without runs is said and skipped)
        if not Path(path).expanduser().exists():
            raise refused("RUN_OR_SWEEP_DIR", path, "no such file or directory", "run directories or folders of them")
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
    """Everything the report holds (nothing written yet); campaigns: endure.json's, on the goodput figure."""
    rows = tb.rows(runs)
    phases = [p for p in tb.phase_names(runs) if any(r.get(f"phase_{p}_seconds") is not None for r in rows)]
    groups = tb.groups(runs, rows)
    figures = plots.all_figures(groups, phases)
    figures["goodput_by_checkpoint_interval_seconds"] = goodput_figure(campaigns or [], groups)
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
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["--help"], ["-h"]):
        print(usage("python -m analysis"))
        return 0
    try:
        paths, output, include, match = parse(argv)
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
    built = build(runs, skipped, failures, campaigns(paths)) if runs else {
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
