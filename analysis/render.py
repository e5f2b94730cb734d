"""Tables of the report (as header + string rows) rendered to Markdown and to one self-contained HTML page
(plots embedded as base64 PNG, styles inline: no external resource)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass

from analysis import panels
from analysis.load import Run, Skipped, SweepFailure
from analysis.table import Group, Stat, common_label, get, num
from restart_harness.results.placement import ranks_text
from restart_harness.results.views import RestartView, SaveView
from restart_harness.schema import LOAD_CATEGORIES, PREDICTED_TOTAL, SAVE_CATEGORIES, io_metadata_ops, span

MIB = 2**20


@dataclass
class Table:
    """A titled table: header and rows of already formatted cells."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


def _table(title: str, header: list[str], rows: list[list[str]], note: str = "") -> Table | None:
    """A table of the rows, None without any (the report leaves it out)."""
    return Table(title, header, rows, note) if rows else None


def fmt(s: Stat | None, digits: int = 3, scale: float = 1.0) -> str:
    """`median` or `median (min to max, n=N)` for repeats; `-` when absent."""
    if s is None:
        return "-"
    m = f"{s.median / scale:.{digits}f}"
    if s.n == 1:
        return m
    return f"{m} (n={s.n})" if s.min == s.max else f"{m} ({span(s.min / scale, s.max / scale, f'.{digits}f')}, n={s.n})"


def _v(value: object, digits: int = 3, scale: float = 1.0) -> str:
    x = num(value)
    if x is None:
        return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"{x / scale:.{digits}f}" if scale != 1 or isinstance(value, float) else str(value)


def configurations(groups: list[Group]) -> Table:
    """One row per configuration: the headline figures, median [min-max] over its repeats."""
    rows = []
    for g in groups:
        restarts = g.restarts
        verified = sum(1 for r in restarts if r.get("restart_verified") is True)
        rows.append([g.key, g.label, str(len(g.runs)), str(len(restarts)), fmt(g.run_stat("checkpoint_files"), 0),
                     fmt(g.run_stat("checkpoint_bytes"), 2, MIB), fmt(g.save_stat("blocking_seconds")),
                     fmt(g.save_stat("durable_seconds")), fmt(g.save_stat("throughput_durable_mib_s"), 1),
                     fmt(g.save_stat("training_lost_seconds")), fmt(g.run_stat("save_memory_peak_added_max_bytes"), 1, MIB),
                     fmt(g.stat("restart_total_seconds")), fmt(g.stat("phase_checkpoint_load_seconds")),
                     f"{verified}/{len(restarts)}" if restarts else "-"])
    return Table("Configurations", ["key", "configuration", "runs", "restarts", "checkpoint files", "checkpoint MiB",
                                    "save blocking s", "save durable s", "save durable MiB/s",
                                    "training lost per save s", "save memory peak per rank MiB", "restart total s",
                                    "checkpoint load s", "verified"], rows,
                 "median [min-max] (n) over repeats; save figures over every save of the configuration's runs; key: "
                 "the configuration's name on figures too crowded for its label"
                 + (f"; every configuration: {common_label(groups)}" if common_label(groups) else ""))


def phases_table(groups: list[Group], phases: list[str]) -> Table:
    """Median seconds of each restart phase per configuration."""
    cols = ["restart_launch_seconds"] + [f"phase_{p}_seconds" for p in phases] + ["restart_total_seconds"]
    rows = [[g.label] + [fmt(g.stat(c)) for c in cols] for g in groups if g.restarts]
    return Table("Restart phases (seconds, slowest rank)", ["configuration", "launch"] + phases + ["total"], rows,
                 "total: slowest rank's process start to first step done, launch not included")


def _latest(groups: list[Group], of, phases_of=lambda x: x) -> tuple[list[tuple], list[str]]:
    """(group, its latest restart, of(that restart)) where that gives something, and the phases those name in
    first-seen order; the latest restart: of the group's latest run that has one."""
    found = [(g, rec, x) for g in groups if (x := of(rec := next(
        (r for run in reversed(g.runs) for r in reversed(run.view.restarts)), RestartView())))]
    return found, list(dict.fromkeys(p for *_, x in found for p in phases_of(x)))


def anatomy_table(groups: list[Group]) -> Table | None:
    """Load and save anatomy per configuration: seconds per category (slowest rank), medians over repeats."""
    rows = []
    for g in groups:
        load = [fmt(g.stat(f"load_{c}_seconds")) for c in LOAD_CATEGORIES]
        save = [fmt(g.save_stat(f"{c}_seconds")) for c in SAVE_CATEGORIES]
        if set(load) | set(save) != {"-"}:
            rows.append([g.label, fmt(g.stat("phase_checkpoint_load_seconds")), *load, *save])
    return _table("Where the time goes (slowest rank, seconds)",
                  ["configuration", "checkpoint load", *(f"load {c}" for c in LOAD_CATEGORIES),
                   *(f"save {c}" for c in SAVE_CATEGORIES)], rows,
                  "load: the restart's checkpoint_load phase split by what the slowest rank's main thread did; save: "
                  "each save split the same way (async engines: the blocking part); definitions in docs/anatomy.md")


def stragglers_table(groups: list[Group]) -> Table | None:
    """Per configuration (its latest restart) and phase: the slowest rank and its excess over the median rank."""
    found, phases = _latest(groups, lambda r: r.stragglers)
    rows = [[g.label, f"{rec.record}{rec.where()}", *(f"rank {st[p]['rank']} +{st[p]['excess_over_median_seconds']:.3f}"
                                                 if p in st else "-" for p in phases)] for g, rec, st in found]
    return _table("Slowest rank per restart phase", ["configuration", "restart", *phases], rows,
                  "rank r +x: rank r took longest, x seconds more than the median rank (the latest restart of each "
                  "configuration)")


def memory_table(groups: list[Group]) -> Table | None:
    """Host memory high-water mark per restart phase (largest over ranks), the latest restart of each."""
    found, phases = _latest(groups, lambda r: r.memory)
    rows = [[g.label, *(f"{mem[p]['peak_rss_bytes_max'] / MIB:,.0f}" if p in mem else "-" for p in phases)]
            for g, _, mem in found]
    return _table("Restart memory per phase (MiB, peak RSS of the largest rank)", ["configuration", *phases], rows,
                  "each rank's resident-memory high-water mark within the phase (VmHWM, reset at each phase)")


def io_table(groups: list[Group]) -> Table | None:
    """The latest restart's I/O besides the checkpoint per phase and rank, and the imports' share in the environment."""
    found, phases = _latest(groups, RestartView.io_by_source, lambda io: io["phases"])

    def cell(io: dict, phase: str) -> str:
        rest = [c for name, c in ((io["phases"].get(phase) or {}).get("sources") or {}).items() if name != "checkpoint"]
        if not rest:
            return "-"
        n = io["ranks"]
        return f"{sum(io_metadata_ops(c) for c in rest) / n:,.0f} / {sum(c.get('read_bytes', 0) for c in rest) / n / MIB:,.1f}"

    def environment_share(io: dict) -> str:
        imports = (io["phases"].get("imports") or {}).get("sources") or {}
        ops = sum(io_metadata_ops(c) for c in imports.values())
        return f"{io_metadata_ops(imports.get('environment') or {}) / ops:.0%}" if ops else "-"

    rows = [[g.label, *(cell(io, p) for p in phases), environment_share(io),
             f"{(io['total'].get('kernel') or {}).get('storage_read_bytes', 0) / io['ranks'] / MIB:,.1f}"]
            for g, _, io in found]
    return _table("Restart I/O besides the checkpoint (per rank: metadata operations / MiB read)",
                  ["configuration", *phases, "imports in environment", "storage delivered MiB"], rows,
                  "metadata operations: opens (failed ones too), stat-family calls and listings outside the "
                  "checkpoint's folder; MiB read through read calls; storage delivered: the kernel's count of bytes "
                  "read from storage, whole restart, mapped libraries included (docs/measurements.md#io-by-source)")


def reshard_table(groups: list[Group]) -> Table | None:
    """Restarts at another layout beside their run's same-layout restarts: conversion, phases, continuity."""
    rows = [[g.label, r["restart_record"], f"{r.get('restart_layout_saved') or '-'} (own)" if own else
             f"{r['restart_layout_saved']} -> {r['restart_layout_loaded']}", "-" if own else
             _v(r.get("conversion_seconds")) + (" (reused)" if r.get("conversion_reused") else ""),
             *(_v(r.get(c)) for c in ("phase_checkpoint_load_seconds", "restart_total_seconds")),
             _v(r.get("first_step_loss"), 6), "-" if own else _v(r.get("first_loss_diff_ratio"), 6),
             _v(r.get("restart_verified"))] for g in groups for own, r in g.reshards]
    return _table("Restarts at another layout", ["configuration", "restart", "layout", "conversion s",
                                                 "checkpoint load s", "restart total s", "first loss",
                                                 "first loss difference", "verified"], rows,
                  "conversion: DeepSpeed's ds_to_universal, once per checkpoint (later restarts reuse it); first loss "
                  "difference: relative to the same-layout restart's first loss on the same global batch; verified: "
                  "every parameter's full fp32 weights and Adam moments equal the saved ones, and the loss continues")


def nodes_table(runs: list[Run]) -> Table | None:
    """Runs on more than one node: per node, its ranks, and the last save's and each restart's bytes and seconds."""
    rows = []
    for run in runs:
        saves = run.view.checkpoint.saves if run.view.checkpoint else ()
        save = saves[-1] if saves else SaveView()
        phases = [(f"save {save.tag}", save, "durable_seconds", "bytes")]
        phases += [(f"{r.record}{r.where()}", r, "total_seconds", "read_bytes") for r in run.view.restarts]
        for name, phase, seconds, nbytes in phases:
            nodes = phase.per_node or []
            if len(nodes) < 2:
                continue
            worst = (phase.slowest_node or {}).get("host")
            for n in nodes:
                rows.append([run.run_id, name, n["host"] + (" (slowest)" if n["host"] == worst else ""),
                             ranks_text(n["ranks"], label=False), _v(n.get(nbytes), 2, MIB), _v(n.get(seconds)),
                             str(n["slowest_rank"]), str(n.get("concurrent_writers_max", "-"))])
    return _table("Placement and per-node figures (runs on more than one node)",
                  ["run", "phase", "node", "ranks", "MiB", "seconds (slowest rank)", "slowest rank",
                   "writers at once"], rows,
                  "node: the host name each rank recorded; save: bytes its ranks wrote and its slowest rank's durable "
                  "seconds; restart: bytes its ranks' loads read (with the I/O counters) and its slowest rank's "
                  "process start to first step; writers at once: the most of its ranks inside a save at one instant")


def prediction_table(groups: list[Group]) -> Table | None:
    """Each configuration's durable save and restart predicted before launch against measured (medians over runs)."""
    rows = []
    for g in groups:
        cells = []
        for phase in ("save_durable_seconds", PREDICTED_TOTAL):
            predicted, measured = g.run_stat(f"predicted_{phase}"), g.run_stat(f"measured_{phase}")
            errors = g.run_stat(f"{phase.removesuffix('_seconds')}_prediction_error_ratio")
            cells += [_v(predicted.median if predicted else None), _v(measured.median if measured else None),
                      "-" if errors is None else f"{errors.median:+.0%}"]
        if any(c != "-" for c in cells):
            rows.append([g.label, *cells])
    return _table("Predicted before launch vs measured", ["configuration", "durable save predicted s", "measured s",
                                                          "error", "restart with launcher predicted s", "measured s",
                                                          "error"], rows,
                  "median over the configuration's runs; durable save: the median of a run's saves; restart with "
                  "launcher: launch + process start to first step; error: (predicted - measured) / measured; every "
                  "phase is in runs.csv (predicted_*, measured_*, *_prediction_error_ratio); docs/prediction.md")


def crossover_table(groups: list[Group]) -> Table | None:
    """Each configuration's predicted crossover and its runs' sides (docs/prediction.md#the-crossover)."""
    return _table("Crossover: the checkpoint size from which the load is the largest restart phase",
                  ["configuration", "checkpoint GiB", "crossover GiB (predicted)", "overtaking",
                   "largest phase predicted", "largest phase measured", "side agrees"], panels.crossover_rows(groups),
                  "crossover: the smallest checkpoint of the configuration's family (its model's size changed) at "
                  "which the predicted checkpoint load exceeds every other restart phase, launch included, as its "
                  "latest run predicted before launch; largest phase: at the run's own checkpoint size; side agrees: "
                  "runs whose measured largest phase is the load exactly where the prediction said so")


def runs_table(table: list[dict]) -> Table:
    """One row per run and restart record."""
    rows = [[r["run_id"], r.get("restart_record") or "-", r["state"], f"{r['model']}",
             f"tp{r['tp']} pp{r['pp']} dp{r['dp']}" + (f" -> {r['restart_layout_loaded'].replace('-', ' ')}" if r.get(
                 "restart_layout_loaded") not in (None, "", r.get("restart_layout_saved")) else ""),
             str(r.get("engine_label") or r["engine"]),
             _v(r.get("checkpoint_files")), _v(r.get("checkpoint_bytes"), 2, MIB), _v(r.get("save_blocking_seconds")),
             _v(r.get("save_durable_seconds")), _v(r.get("restart_total_seconds")),
             _v(r.get("restart_cache_observed")), _v(r.get("restart_verified"))] for r in table]
    return Table("Runs and restart records", ["run", "restart", "state", "model", "layout", "engine", "files", "MiB",
                                              "save blocking s", "save durable s", "restart total s", "cache",
                                              "verified"], rows,
                 "save figures are those of the save the restart loaded; every column is in runs.csv")


def baseline_table(table: list[dict]) -> Table | None:
    """Storage baselines recorded with the runs, with the efficiency the harness derived from them."""
    first = {}  # runs.csv has a row per restart: a run's baseline is one measurement, shown once
    for r in table:
        if r.get("baseline_write_mib_s") is not None or r.get("baseline_read_mib_s") is not None:
            first.setdefault(r["run_id"], r)
    def spread(r: dict, way: str) -> str:
        low, high = r.get(f"baseline_{way}_min_mib_s"), r.get(f"baseline_{way}_max_mib_s")
        return span(low, high, ",.0f") if low is not None and high is not None else "-"

    def ceiling(r: dict, way: str) -> str:
        value = r.get(f"ceiling_{way}_mib_s")
        return "-" if value is None else f"{value:,.1f} ({r.get(f'ceiling_{way}_from')})"

    rows = [[r["run_id"], _v(r.get("baseline_method")), _v(r.get("baseline_write_mib_s"), 1), spread(r, "write"),
             _v(r.get("baseline_read_mib_s"), 1), spread(r, "read"), _v(r.get("baseline_probes_count")),
             _v(r.get("efficiency_save_ratio")), _v(r.get("efficiency_load_ratio")), ceiling(r, "write"),
             ceiling(r, "read"), _v(r.get("efficiency_save_of_ceiling_ratio")),
             _v(r.get("efficiency_load_of_ceiling_ratio")),
             {True: "yes", False: "no"}.get(r.get("machine_busy_at_launch"), "-")] for r in first.values()]
    return _table("Storage baseline and ceiling", ["run", "method", "write MiB/s", "write min-max", "read MiB/s",
                                                   "read min-max", "probes", "save efficiency", "load efficiency",
                                                   "ceiling write MiB/s", "ceiling read MiB/s", "save of ceiling",
                                                   "load of ceiling", "machine busy"], rows,
                  "write/read: the median probe; min-max: over the probes (how far the baseline, and each efficiency "
                  "derived from it, can be trusted); efficiency: durable save (load) throughput / baseline write "
                  "(read) throughput; ceiling: the storage at its best, per direction the better of a direct-I/O probe "
                  "(engine=lazy's requests and queue depth) and the baseline (which one in brackets), and the same "
                  "throughputs over it; machine busy: other work on the machine before the checkpoint launch")


def problems_table(skipped: list[Skipped], runs: list[Run], failures: list[SweepFailure]) -> Table | None:
    """What was skipped, what was read with caveats, and failed sweep combinations."""
    rows = [["skipped", str(s.path), s.reason] for s in skipped]
    for r in runs:
        if r.state != "complete":
            reason = get(r.summary, "status", "reason", default="no reason given")
            rows.append([r.state, str(r.dir), f"in runs.csv, left out of the plots: {reason}"])
        rows.extend(["note", str(r.dir), n] for n in r.notes)
    rows.extend(["sweep " + f.state, f"{f.sweep}: {f.combination}", f.reason] for f in failures)
    return _table("Skipped and incomplete", ["what", "where", "why"], rows)


def markdown(title: str, tables: list[Table], figures: list[str], missing: list[str]) -> str:
    """The report as Markdown: tables, then the figures as image links."""
    out = [f"# {title}", ""]
    for t in tables:
        rows = ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |"
                for row in [t.header, *t.rows]]
        out += [f"## {t.title}", "", rows[0], "|" + "---|" * len(t.header), *rows[1:]]
        out += ["", f"_{t.note}_", ""] if t.note else [""]
    out += ["## Figures", ""]
    out += [f"![{name}]({name}.png)\n" for name in figures]
    if missing:
        out += [f"No data in these runs for: {', '.join(missing)}.", ""]
    return "\n".join(out)


STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;font-size:.9em;text-align:left}th{background:#f0f0f0}
tr:nth-child(even) td{background:#fafafa}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.note{color:#666;font-size:.85em}"""


def html_page(title: str, tables: list[Table], pngs: dict[str, bytes], missing: list[str]) -> str:
    """One HTML page holding everything: tables, and each PNG as a data: URI."""
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{e(title)}</h1>"]
    for t in tables:
        parts.append(f"<h2>{e(t.title)}</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in t.header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in t.rows]
        parts.append("</table>" + (f"<p class='note'>{e(t.note)}</p>" if t.note else ""))
    parts.append("<h2>Figures</h2>")
    for name, png in pngs.items():
        data = base64.b64encode(png).decode()
        parts.append(f"<figure><img alt='{e(name)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption class='note'>{e(name)}.png</figcaption></figure>")
    if missing:
        parts.append(f"<p class='note'>No data in these runs for: {e(', '.join(missing))}.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def documents(name: str, title: str, tables: list[Table], pngs: dict[str, bytes], missing: list[str]) -> dict:
    """name.md and name.html of the tables and figures, then each figure's PNG: file name -> bytes."""
    return {f"{name}.md": markdown(title, tables, list(pngs), missing).encode(),
            f"{name}.html": html_page(title, tables, pngs, missing).encode(), **{f"{k}.png": v for k, v in pngs.items()}}
