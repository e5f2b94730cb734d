"""Figures of one bar or dot per configuration from groups of runs. Each function returns a matplotlib Figure (object
API, no pyplot state: headless and in a notebook alike), or None when no run has the data it plots."""

from __future__ import annotations

import re
import textwrap
from itertools import product

from matplotlib.figure import Figure

from analysis import layout, panels
from analysis.layout import bar_figure, caption, fit, grouped_bars, legend, named, stacked_bars, ticks, title
from analysis.table import Group, Stat, get, num, stat
from restart_harness.schema import KINDS, LOAD_CATEGORIES, PREDICTED_PHASES, PREDICTED_TOTAL, SAVE_CATEGORIES

PHASE_COLORS = {"launch": "#bbbbbb"}
CAPTION = "bars: median over repeats; whiskers: min to max where n > 1"
SAVES_CAPTION = "bars: median over every save of the configuration's runs; whiskers: min to max where n > 1"


def _labelled(fig: Figure, ax, ylabel: str, heading: str, note: str, gs: list[Group] | None = None,
              **legend_kw) -> Figure:
    """fig with the y label, title and legend of its axes, and its caption."""
    ax.set_ylabel(ylabel)
    title(ax, heading)
    legend(ax, **legend_kw)
    caption(fig, note, gs)
    return fig


def checkpoint_by_layout(groups: list[Group], column: str, ylabel: str, heading: str) -> Figure | None:
    """Bars per layout (x) and model/engine (series) of a per-run checkpoint figure."""
    gs = [g for g in groups if (g.run_stat("checkpoint_bytes") or Stat(0, 0, 0, 0)).median > 0]  # none: engine none
    if not gs:
        return None
    layouts = list(dict.fromkeys(g.layout for g in gs))
    series: dict[str, list[Stat | None]] = {}
    for g in gs:
        name = " ".join(x for x in (g.model, g.engine, g.extra) if x)
        series.setdefault(name, [None] * len(layouts))[layouts.index(g.layout)] = g.run_stat(column)
    largest = max(s.max for ss in series.values() for s in ss if s)
    smallest = min((s.median for ss in series.values() for s in ss if s and s.median > 0), default=largest)
    unit, scale = layout.byte_unit(largest) if column.endswith("_bytes") else ("", 1)
    fig, ax = bar_figure(len(layouts) * max(1, len(series)) / 2 + 1)
    grouped_bars(ax, layouts, series, scale, "{:,.0f}" if scale == 1 else "{:,.2f}")
    ax.set_xlabel("layout (tensor, pipeline, data parallel degrees)")
    spans_decades = largest > layout.LOG_SPAN * smallest  # on a linear axis the small bars would vanish
    if spans_decades:
        ax.set_yscale("log")
    return _labelled(fig, ax, ylabel.format(unit=unit) + (", log scale" if spans_decades else ""), heading, CAPTION,
                     title="model, engine")


def checkpoint_bytes(groups: list[Group]) -> Figure | None:
    """Checkpoint size per layout and model (the tag directory the restart loaded)."""
    return checkpoint_by_layout(groups, "checkpoint_bytes", "checkpoint size ({unit})",
                                "Checkpoint size per layout and model")


def checkpoint_files(groups: list[Group]) -> Figure | None:
    """Checkpoint file count per layout and model."""
    return checkpoint_by_layout(groups, "checkpoint_files", "files in the checkpoint (count)",
                                "Checkpoint files per layout and model")


def save_seconds(groups: list[Group]) -> Figure | None:
    """Blocking vs durable save seconds per configuration, over every save of its runs."""
    if not (gs := [g for g in groups if g.save_stat("blocking_seconds")]):
        return None
    fig, ax = bar_figure(len(gs))
    series = {
        "blocking (training waits)": [g.save_stat("blocking_seconds") for g in gs],
        "durable (on stable storage)": [g.save_stat("durable_seconds") for g in gs]}
    if any(g.save_stat("training_lost_seconds") for g in gs):  # docs/measurements.md#training-lost
        series["training lost (blocking + slowed steps + waits)"] = [g.save_stat("training_lost_seconds") for g in gs]
    grouped_bars(ax, ticks(fig, gs), series)
    noise = [g for g in gs if g.save_stat("training_lost_seconds") and all(
        r.get("training_lost_within_noise") for r in g.saves if r.get("training_lost_seconds") is not None)]
    return _labelled(fig, ax, "save time (s)", "Save time per engine: blocking, durable and training time lost\n"
                     "(every save; slowest rank; training lost on the ranks' common timeline)", SAVES_CAPTION + (
                         "\ntraining lost within the steps' own noise, no measurable cost: " + named(fig, noise)
                         if noise else ""), gs)


def throughput(groups: list[Group]) -> Figure | None:
    """Save and restart load throughput per configuration; storage baseline and ceiling where measured."""
    gs = [g for g in groups if g.save_stat("throughput_durable_mib_s") or g.stat("restart_load_throughput_mib_s")]
    if not gs:
        return None
    fig, ax = bar_figure(len(gs))
    series = {
        "save, blocking": [g.save_stat("throughput_blocking_mib_s") for g in gs],
        "save, durable": [g.save_stat("throughput_durable_mib_s") for g in gs],
        "restart load": [g.stat("restart_load_throughput_mib_s") for g in gs],
        # bytes read over the time inside the reads (runs of harness >= 0.3: docs/measurements.md)
        "restart, storage read": [g.stat("restart_storage_read_throughput_mib_s") for g in gs]}
    grouped_bars(ax, ticks(fig, gs), {k: v for k, v in series.items() if any(v)})
    for (kind, colour), (way, style) in product((("baseline", "black"), ("ceiling", "firebrick")),
                                                (("write", "--"), ("read", ":"))):
        for k, (j, s) in enumerate((j, s) for j, g in enumerate(gs) if (s := g.run_stat(f"{kind}_{way}_mib_s"))):
            ax.hlines(s.median, j - 0.45, j + 0.45, colors=colour, linestyles=style, linewidth=1.6,
                      label=None if k else f"storage {kind}, {way}")  # one legend entry
    above = [g for g in gs if (r := g.stat("restart_storage_read_throughput_mib_s")) and (b := g.run_stat(
        "baseline_read_mib_s")) and r.median > b.median]
    return _labelled(fig, ax, "throughput (MiB/s)",
                     "Checkpoint throughput per engine\n(bytes / slowest rank's seconds)", CAPTION + (
                         "\nabove the baseline's read: " + named(fig, above) + " - the baseline (one sequential cold "
                         "read per rank at one file size) is not this storage's limit for these reads "
                         "(docs/measurements.md)" if above else ""), gs)


def restart_phases(groups: list[Group], phases: list[str]) -> Figure | None:
    """Restart seconds as stacked phases (medians) per configuration; the whisker: min-max of their sum."""
    if not (gs := [g for g in groups if g.restarts]):
        return None
    cols = ["restart_launch_seconds"] + [f"phase_{p}_seconds" for p in phases]
    used = [(c, n) for c, n in zip(cols, ["launch"] + phases, strict=True) if any(g.stat(c) for g in gs)]
    fig, ax = bar_figure(len(gs), height=4.8)
    stacked_bars(ax, ticks(fig, gs), [(name.replace("_", " "), [(g.stat(col) or Stat(0, 0, 0, 0)).median for g in gs],
                                       PHASE_COLORS.get(name, f"C{i - 1}")) for i, (col, name) in enumerate(used)])
    for j, g in enumerate(gs):
        sums = stat([sum(num(r.get(c)) or 0.0 for c, _ in used) for r in g.restarts])
        if sums and sums.n > 1:
            ax.errorbar([j + 0.34], [sums.median], yerr=[[sums.median - sums.min], [sums.max - sums.median]],
                        fmt="o", color="black", markersize=3, capsize=4, elinewidth=1.2)
    return _labelled(fig, ax, "restart time (s)", "Restart time by phase (slowest rank per phase)", "stacks: median of "
                     "each phase; dot and whisker: median and min-max of the total over restarts, where n > 1", gs,
                     title="phase")


def file_sizes(groups: list[Group]) -> Figure | None:
    """Every checkpoint file's size (log scale), a row per configuration (its latest run's inventory), by kind."""
    rows = []
    for g in groups:
        inv = next((r.inventory for r in reversed(g.runs) if r.inventory), None)
        files = [f for f in (inv or {}).get("files", []) if isinstance(f, dict) and num(f.get("bytes"))]
        if files:
            rows.append((g, files))
    if not rows:
        return None
    labels = [f"{layout.wrap(g.label, layout.TICK_CHARS)}\n({len(fs)} files)" for g, fs in rows]
    fig = Figure(figsize=(9.0, 1.6 + sum(max(0.55, 0.13 * t.count("\n") + 0.2) for t in labels)), layout="constrained")
    ax = fig.add_subplot()
    kinds = list(dict.fromkeys([*KINDS, *(str(f.get("kind")) for _, fs in rows for f in fs)]))
    for i, kind in enumerate(kinds):
        xs, ys = [], []
        for j, (_, files) in enumerate(rows):
            mine = [f["bytes"] for f in files if str(f.get("kind")) == kind]
            xs += mine
            # spread the files of a row over a band so that equal sizes do not hide each other
            ys += [j + 0.3 * ((k * 0.618) % 1 - 0.5) for k in range(len(mine))]
        if xs:
            ax.scatter(xs, ys, s=22, alpha=0.8, color=f"C{i}", label=kind.replace("_", " "))
    ax.set(xscale="log", ylim=(len(rows) - 0.5, -0.5), xlabel="file size (bytes, log scale)")
    ax.set_yticks(range(len(rows)), labels, fontsize="small")
    title(ax, "Checkpoint file sizes (each dot one file)")
    ax.grid(axis="x", which="both", alpha=0.3)
    legend(ax, title="kind")
    return fig


def step_seconds(groups: list[Group]) -> Figure | None:
    """Median training step seconds per configuration (engine none is the no-checkpoint baseline)."""
    if not (gs := [g for g in groups if g.run_stat("step_median_seconds")]):
        return None
    series = {"all steps": [g.run_stat("step_median_seconds") for g in gs]}
    if any(g.run_stat("step_in_flight_median_seconds") for g in gs):
        series["steps with a save in flight"] = [g.run_stat("step_in_flight_median_seconds") for g in gs]
    fig, ax = bar_figure(len(gs))
    grouped_bars(ax, ticks(fig, gs), series)
    return _labelled(fig, ax, "training step time, median per run (s)", "Training step time per engine",
                     CAPTION + " (over runs)", gs)


def _stacked(groups: list[Group], columns: list[tuple[str, str]], ylabel: str, heading: str, note: str,
             source=None) -> Figure | None:
    """One stacked bar per configuration: each (column, name) a segment, its median over the group's rows."""
    stat_of = source or (lambda g, c: g.stat(c))
    if not (gs := [g for g in groups if any(stat_of(g, c) for c, _ in columns)]):
        return None
    fig, ax = bar_figure(len(gs), height=4.6)
    segments = [(name, [(stat_of(g, column) or Stat(0, 0, 0, 0)).median for g in gs],
                 layout.CATEGORY_COLORS.get(name, f"C{i}")) for i, (column, name) in enumerate(columns)]
    stacked_bars(ax, ticks(fig, gs), [s for s in segments if any(s[1])])
    return _labelled(fig, ax, ylabel, heading, note, gs, title="where the time goes")


def load_breakdown(groups: list[Group]) -> Figure | None:
    """The restart's checkpoint load split into read, deserialize, copy, wait and other (slowest rank)."""
    return _stacked(groups, [(f"load_{c}_seconds", c) for c in LOAD_CATEGORIES], "load time (s)",
                    "Where checkpoint load time goes (slowest rank)",
                    "stacks: median over restarts of the slowest rank's seconds per category (docs/anatomy.md)")


def save_breakdown(groups: list[Group]) -> Figure | None:
    """Saves split into serialize, write, fsync, wait and other (slowest rank; the blocking part for async)."""
    return _stacked(groups, [(f"{c}_seconds", c) for c in SAVE_CATEGORIES], "save time (s)",
                    "Where save time goes\n(slowest rank; async engines: the blocking part)",
                    "stacks: median over every save of the slowest rank's seconds per category (docs/anatomy.md)",
                    source=lambda g, c: g.save_stat(c))

def reshard_seconds(groups: list[Group], phases: list[str]) -> Figure | None:
    """Each restart at another layout beside its run's same-layout restart: conversion, then the restart's phases."""
    bars = [(f"{g.tick}\n" + (r.get("restart_layout_saved") or "own layout" if own else
                              f"-> {r['restart_layout_loaded']}"), r) for g in groups for own, r in g.reshards]
    if not bars:
        return None
    fig, ax = bar_figure(len(bars), height=4.8)
    segments = []
    for i, (column, name) in enumerate([("conversion_seconds", "conversion")]
                                       + [(f"phase_{p}_seconds", p) for p in phases]):
        # a reused conversion was paid by an earlier restart: drawn only where it ran
        heights = [0.0 if name == "conversion" and r.get("conversion_reused") in (True, "true") else
                   num(r.get(column)) or 0.0 for _, r in bars]
        color = "#444444" if name == "conversion" else layout.PHASE_PALETTE[(i - 1) % len(layout.PHASE_PALETTE)]
        segments += [(name.replace("_", " "), heights, color)] if any(heights) else []
    stacked_bars(ax, [label for label, _ in bars], segments)
    return _labelled(fig, ax, "seconds", "Restart at another layout:\nconversion and restart phases (slowest rank)",
                     "first bar of each run: its restart at the layout that wrote the checkpoint; conversion is paid "
                     "once per checkpoint and reused by later restarts (shown where it ran)")


def prediction(groups: list[Group]) -> Figure | None:
    """Predicted against measured seconds, every phase of every run that carries a prediction."""
    points: dict[str, list[tuple[float, float]]] = {}
    calibrations = set()
    for run in (run for g in groups for run in g.runs):
        phases = get(run.summary, "prediction", "phases") or {}
        made = get(run.summary, "prediction", "calibration") or {}
        if made.get("name"):
            calibrations.add(f"{made['name']} (fitted {str(made.get('fitted_at'))[:16]})")
        for name in PREDICTED_PHASES:
            p = phases.get(name) or {}
            m, v = num(p.get("measured")), num(p.get("predicted"))
            if m and v and m > 0 and v > 0:
                points.setdefault(name, []).append((m, v))
    if not points:
        return None
    markers = "osD^v<>Pp*hX"
    series = [(pts, {"s": 40, "marker": "X", "color": "black", "zorder": 4} if name == PREDICTED_TOTAL else
               {"s": 22, "marker": markers[i % len(markers)], "color": f"C{i % 10}", "zorder": 3},
               name.removesuffix("_seconds").replace("_", " ")) for i, (name, pts) in enumerate(points.items())]
    fig = layout.measured_vs_predicted(series, "Predicted vs measured seconds, per phase and run", "measured (s)",
                                       "predicted before launch (s)")
    names = ", ".join(sorted(calibrations)) or "?"
    caption(fig, "each point: one phase of one run, predicted before launch (docs/prediction.md); calibration "
                  f"{textwrap.shorten(names, 150)}")
    return fig


def _per_model(name: str, draw, groups: list[Group]) -> dict[str, Figure | None]:
    """One figure per model where the runs are of several (a 3 MiB and a 231 GiB model share no axis)."""
    models = list(dict.fromkeys(g.model for g in groups))
    if len(models) < 2:
        return {name: draw(groups)}
    return {f"{name}_{re.sub(r'[^A-Za-z0-9.-]', '_', m)}": draw([g for g in groups if g.model == m]) for m in models}


def _pages(name: str, figures: list[Figure]) -> dict[str, Figure | None]:
    """name, name_2, name_3, ... for the pages of one figure (None: no data)."""
    return {name if n == 1 else f"{name}_{n}": fig for n, fig in enumerate(figures, 1)} if figures else {name: None}


def all_figures(groups: list[Group], phases: list[str]) -> dict[str, Figure | None]:
    """Every figure by file name (unit in the name), fitted (layout.fit); None where no run has its data."""
    figures = {
        **_per_model("checkpoint_bytes", checkpoint_bytes, groups),
        **_per_model("checkpoint_files", checkpoint_files, groups),
        "save_seconds": save_seconds(groups),
        "throughput_mib_s": throughput(groups),
        "restart_phases_seconds": restart_phases(groups, phases),
        "file_size_bytes": file_sizes(groups),
        "step_seconds": step_seconds(groups),
        "load_breakdown_seconds": load_breakdown(groups),
        "save_breakdown_seconds": save_breakdown(groups),
        **_pages("restart_timeline_seconds", panels.restart_timelines(groups, phases)),
        **_pages("step_timeline_seconds", panels.step_timelines(groups)),
        **_pages("restart_io_by_source", panels.restart_io(groups, phases)),
        **_pages("restart_causes_seconds", panels.restart_causes(groups)),
        "reshard_seconds": reshard_seconds(groups, phases),
        "prediction_seconds": prediction(groups),
        **_pages("crossover_seconds", panels.crossover_figures(groups))}
    return {name: fig if fig is None else fit(fig) for name, fig in figures.items()}
