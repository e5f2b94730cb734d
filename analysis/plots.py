"""Figures from groups of runs. Each function returns a matplotlib Figure (object API, no pyplot state, so it
works headless and in a notebook alike), or None when no run has the data it plots. Bars are medians over
repeats; a black whisker spans min to max where a bar has more than one repeat."""

from __future__ import annotations

import re
import textwrap

from matplotlib.figure import Figure

from analysis import crossover
from analysis.layout import TICK_CHARS, fit, legend, wrap
from analysis.table import (
    KINDS,
    LOAD_CATEGORIES,
    PREDICTED_PHASES,
    SAVE_CATEGORIES,
    Group,
    Stat,
    common_label,
    get,
    num,
    restart_where,
    stat,
)
from restart_harness.schema import PREDICTED_TOTAL, io_metadata_ops

PHASE_COLORS = {"launch": "#bbbbbb"}
UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
MAX_WIDTH_IN = 20.0
CAPTION = "bars: median over repeats; whiskers: min to max where n > 1"
SAVES_CAPTION = "bars: median over every save of the configuration's runs; whiskers: min to max where n > 1"
CHAR_IN = 0.075  # width of a tick label's character at the default size, inches: whether labels fit their slots
XSMALL_CHAR_IN = 0.06  # ... of an x-small one
BESIDE_IN = 3.6  # of a page's width, what its y labels and legend take


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit that keeps the largest value readable (at least 1 of it)."""
    for name, size in UNITS:
        if largest >= size:
            return name, size
    return "bytes", 1


def _figure(n_categories: int, height: float = 4.2) -> tuple[Figure, object]:
    # wide enough for multi-line tick labels, but capped so a big sweep still fits a screen (smaller ticks then)
    fig = Figure(figsize=(min(MAX_WIDTH_IN, max(6.0, 1.6 + 1.5 * n_categories)), height), layout="constrained")
    ax = fig.add_subplot()
    if 1.6 + 1.5 * n_categories > MAX_WIDTH_IN:
        ax.tick_params(axis="x", labelsize="x-small")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return fig, ax


def _caption(fig: Figure, text: str, groups: list[Group] | None = None) -> None:
    """Small grey note under the axes (a supxlabel, so the layout makes room for it); with groups, also what every
    configuration shown shares (their labels leave it out), and where configuration keys on the axis are named."""
    common = common_label(groups) if groups else ""
    keyed = "\nC1, C2, ...: the configurations table of report.md names each" if getattr(fig, "keyed", False) else ""
    text += (f"\nevery configuration: {common}" if common else "") + keyed
    width = max(40, int(fig.get_size_inches()[0] * 15))  # x-small characters an inch: a longer line was cut off
    fig.supxlabel("\n".join(textwrap.fill(line, width) for line in text.splitlines()), fontsize="x-small",
                  color="0.4")


def _ticks(fig: Figure, gs: list[Group]) -> list[str]:
    """Each configuration's label under its slot, or its key (C1, ...) where the labels would overlap: the report's
    configurations table names every key (the caption says so)."""
    slot = fig.get_size_inches()[0] * 0.7 / max(1, len(gs))
    widest = max((len(line) for g in gs for line in g.tick.splitlines()), default=0) * CHAR_IN
    if widest <= slot:
        return [g.tick for g in gs]
    fig.keyed = True
    return [g.key for g in gs]


def _title(ax, text: str) -> None:
    """A figure's title on as many lines as its width needs (a title longer than the axes was cut off)."""
    width = max(30, int(ax.figure.get_size_inches()[0] * 11))
    ax.set_title("\n".join(textwrap.fill(line, width) for line in text.splitlines()), loc="left")

def grouped_bars(ax, categories: list[str], series: dict[str, list[Stat | None]], scale: float = 1.0,
                 value_format: str | None = None) -> None:
    """One bar per (category, series) that has a value, median height, min-max whisker when n > 1. Within a
    category the bars present share its width, so a category with one series gets one centred bar."""
    present = [[name for name, stats in series.items() if stats[j] is not None] for j in range(len(categories))]
    for i, (name, stats) in enumerate(series.items()):
        xs, hs, lo, hi, ns = [], [], [], [], []
        for j, s in enumerate(stats):
            if s is None:
                continue
            width = 0.8 / len(present[j])
            xs.append(j - 0.4 + width * (present[j].index(name) + 0.5))
            hs.append(s.median / scale)
            lo.append((s.median - s.min) / scale)
            hi.append((s.max - s.median) / scale)
            ns.append(s.n)
        widths = [0.8 / len(present[round(x)]) * 0.95 for x in xs]
        bars = ax.bar(xs, hs, width=widths, label=name, color=f"C{i}")
        if value_format:
            ax.bar_label(bars, fmt=value_format, fontsize="small", padding=2)
        reps = [k for k, n in enumerate(ns) if n > 1]
        if reps:
            ax.errorbar([xs[k] for k in reps], [hs[k] for k in reps], yerr=[[lo[k] for k in reps],
                        [hi[k] for k in reps]], fmt="none", ecolor="black", capsize=4, elinewidth=1.2)
    ax.set_xticks(range(len(categories)), categories)
    ax.set_xlim(-0.6, len(categories) - 0.4)


def _with_checkpoint(groups: list[Group]) -> list[Group]:
    """Groups whose runs wrote a checkpoint (engine none writes none)."""
    return [g for g in groups if (g.run_stat("checkpoint_bytes") or Stat(0, 0, 0, 0)).median > 0]


LOG_SPAN = 100  # a figure whose values span more than this factor gets a log axis


def checkpoint_by_layout(groups: list[Group], column: str, ylabel: str, title: str) -> Figure | None:
    """Bars per layout (x) and model/engine (series) of a per-run checkpoint figure."""
    gs = _with_checkpoint(groups)
    if not gs:
        return None
    layouts = list(dict.fromkeys(g.layout for g in gs))
    series: dict[str, list[Stat | None]] = {}
    for g in gs:
        name = " ".join(x for x in (g.model, g.engine, g.extra) if x)
        series.setdefault(name, [None] * len(layouts))[layouts.index(g.layout)] = g.run_stat(column)
    largest = max(s.max for ss in series.values() for s in ss if s)
    smallest = min((s.median for ss in series.values() for s in ss if s and s.median > 0), default=largest)
    unit, scale = byte_unit(largest) if column.endswith("_bytes") else ("", 1)
    fig, ax = _figure(len(layouts) * max(1, len(series)) / 2 + 1)
    grouped_bars(ax, layouts, series, scale, "{:,.0f}" if scale == 1 else "{:,.2f}")
    ax.set_xlabel("layout (tensor, pipeline, data parallel degrees)")
    spans_decades = largest > LOG_SPAN * smallest  # on a linear axis the small bars would vanish
    if spans_decades:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel.format(unit=unit) + (", log scale" if spans_decades else ""))
    _title(ax, title)
    legend(ax, title="model, engine")
    _caption(fig, CAPTION)
    return fig


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
    gs = [g for g in groups if g.save_stat("blocking_seconds")]
    if not gs:
        return None
    fig, ax = _figure(len(gs))
    series = {
        "blocking (training waits)": [g.save_stat("blocking_seconds") for g in gs],
        "durable (on stable storage)": [g.save_stat("durable_seconds") for g in gs],
    }
    if any(g.save_stat("training_lost_seconds") for g in gs):  # docs/measurements.md#training-lost
        series["training lost (blocking + slowed steps + waits)"] = [g.save_stat("training_lost_seconds") for g in gs]
    grouped_bars(ax, _ticks(fig, gs), series)
    ax.set_ylabel("save time (s)")
    _title(ax, "Save time per engine: blocking, durable and training time lost\n"
               "(every save; slowest rank; training lost on the ranks' common timeline)")
    legend(ax)
    noise = [g for g in gs if g.save_stat("training_lost_seconds") and all(
        r.get("training_lost_within_noise") for r in g.saves if r.get("training_lost_seconds") is not None)]
    _caption(fig, SAVES_CAPTION + ("\ntraining lost within the steps' own noise, no measurable cost: "
                                   + ", ".join(g.key if getattr(fig, "keyed", False) else g.label for g in noise)
                                   if noise else ""), gs)
    return fig


def throughput(groups: list[Group]) -> Figure | None:
    """Save (blocking, durable) and restart load throughput per configuration; storage baseline and ceiling where
    measured."""
    gs = [g for g in groups if g.save_stat("throughput_durable_mib_s") or g.stat("restart_load_throughput_mib_s")]
    if not gs:
        return None
    fig, ax = _figure(len(gs))
    series = {
        "save, blocking": [g.save_stat("throughput_blocking_mib_s") for g in gs],
        "save, durable": [g.save_stat("throughput_durable_mib_s") for g in gs],
        "restart load": [g.stat("restart_load_throughput_mib_s") for g in gs],
        # bytes read over the time inside the reads (runs of harness >= 0.3: docs/measurements.md)
        "restart, storage read": [g.stat("restart_storage_read_throughput_mib_s") for g in gs],
    }
    grouped_bars(ax, _ticks(fig, gs), {k: v for k, v in series.items() if any(v)})
    for column, style, colour, name in (("baseline_write_mib_s", "--", "black", "storage baseline, write"),
                                        ("baseline_read_mib_s", ":", "black", "storage baseline, read"),
                                        ("ceiling_write_mib_s", "--", "firebrick", "storage ceiling, write"),
                                        ("ceiling_read_mib_s", ":", "firebrick", "storage ceiling, read")):
        labelled = False
        for j, g in enumerate(gs):
            s = g.run_stat(column)
            if s:
                ax.hlines(s.median, j - 0.45, j + 0.45, colors=colour, linestyles=style, linewidth=1.6,
                          label=None if labelled else name)
                labelled = True
    ax.set_ylabel("throughput (MiB/s)")
    _title(ax, "Checkpoint throughput per engine\n(bytes / slowest rank's seconds)")
    legend(ax)
    above = [g for g in gs if (r := g.stat("restart_storage_read_throughput_mib_s")) and (b := g.run_stat(
        "baseline_read_mib_s")) and r.median > b.median]
    _caption(fig, CAPTION + ("\nabove the baseline's read: " + ", ".join(g.key if getattr(fig, "keyed", False)
                                                                         else g.label for g in above)
                             + " - the baseline (one sequential cold read per rank at one file size) is not this "
                             "storage's limit for these reads (docs/measurements.md)" if above else ""), gs)
    return fig


def restart_phases(groups: list[Group], phases: list[str]) -> Figure | None:
    """Restart seconds as stacked phases per configuration: launcher, then each phase (medians); the whisker
    spans min-max of the stacked sum over restart records."""
    gs = [g for g in groups if any(r.get("restart_record") for r in g.rows)]
    if not gs:
        return None
    cols = ["restart_launch_seconds"] + [f"phase_{p}_seconds" for p in phases]
    names = ["launch"] + phases
    used = [(c, n) for c, n in zip(cols, names, strict=True) if any(g.stat(c) for g in gs)]
    fig, ax = _figure(len(gs), height=4.8)
    bottoms = [0.0] * len(gs)
    for i, (col, name) in enumerate(used):
        heights = [(g.stat(col) or Stat(0, 0, 0, 0)).median for g in gs]
        ax.bar(range(len(gs)), heights, bottom=bottoms, width=0.6, label=name.replace("_", " "),
               color=PHASE_COLORS.get(name, f"C{i - 1}"))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for j, g in enumerate(gs):
        sums = stat([sum(num(r.get(c)) or 0.0 for c, _ in used) for r in g.rows if r.get("restart_record")])
        if sums and sums.n > 1:
            ax.errorbar([j + 0.34], [sums.median], yerr=[[sums.median - sums.min], [sums.max - sums.median]],
                        fmt="o", color="black", markersize=3, capsize=4, elinewidth=1.2)
    ax.set_xticks(range(len(gs)), _ticks(fig, gs))
    ax.set_xlim(-0.6, len(gs) - 0.4)
    ax.set_ylabel("restart time (s)")
    _title(ax, "Restart time by phase (slowest rank per phase)")
    legend(ax, title="phase")
    _caption(fig, "stacks: median of each phase; dot and whisker: median and min-max of the total over "
             "restarts, where n > 1", gs)
    return fig


def file_sizes(groups: list[Group]) -> Figure | None:
    """Every checkpoint file's size (log scale), one row per configuration (its latest run's inventory),
    coloured by kind (model states, optimizer states, layer states, other)."""
    rows = []
    for g in groups:
        inv = next((r.inventory for r in reversed(g.runs) if r.inventory), None)
        files = [f for f in (inv or {}).get("files", []) if isinstance(f, dict) and num(f.get("bytes"))]
        if files:
            rows.append((g, files))
    if not rows:
        return None
    ticks = [f"{wrap(g.label, TICK_CHARS)}\n({len(fs)} files)" for g, fs in rows]
    fig = Figure(figsize=(9.0, 1.6 + sum(max(0.55, 0.13 * t.count("\n") + 0.2) for t in ticks)), layout="constrained")
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
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), ticks, fontsize="small")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("file size (bytes, log scale)")
    _title(ax, "Checkpoint file sizes (each dot one file)")
    ax.grid(axis="x", which="both", alpha=0.3)
    legend(ax, title="kind")
    return fig


def step_seconds(groups: list[Group]) -> Figure | None:
    """Median training step seconds per configuration (engine none is the no-checkpoint baseline)."""
    gs = [g for g in groups if g.run_stat("step_median_seconds")]
    if not gs:
        return None
    series = {"all steps": [g.run_stat("step_median_seconds") for g in gs]}
    if any(g.run_stat("step_in_flight_median_seconds") for g in gs):
        series["steps with a save in flight"] = [g.run_stat("step_in_flight_median_seconds") for g in gs]
    fig, ax = _figure(len(gs))
    grouped_bars(ax, _ticks(fig, gs), series)
    ax.set_ylabel("training step time, median per run (s)")
    _title(ax, "Training step time per engine")
    legend(ax)
    _caption(fig, CAPTION + " (over runs)", gs)
    return fig


def _stacked(groups: list[Group], columns: list[tuple[str, str]], ylabel: str, title: str, caption: str,
             source=None) -> Figure | None:
    """One stacked bar per configuration: each (column, name) a segment, its median over the group's rows."""
    stat_of = source or (lambda g, c: g.stat(c))
    gs = [g for g in groups if any(stat_of(g, c) for c, _ in columns)]
    if not gs:
        return None
    fig, ax = _figure(len(gs), height=4.6)
    bottoms = [0.0] * len(gs)
    for i, (column, name) in enumerate(columns):
        heights = [(stat_of(g, column) or Stat(0, 0, 0, 0)).median for g in gs]
        if not any(heights):
            continue
        ax.bar(range(len(gs)), heights, bottom=bottoms, width=0.6, label=name, color=CATEGORY_COLORS.get(name, f"C{i}"))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(gs)), _ticks(fig, gs))
    ax.set_xlim(-0.6, len(gs) - 0.4)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    legend(ax, title="where the time goes")
    _caption(fig, caption, gs)
    return fig


# Phases in light colours, what happens inside the load in strong ones, so the two never read as the same.
PHASE_PALETTE = ("#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5", "#c49c94")
CATEGORY_COLORS = {"read": "#1f77b4", "write": "#1f77b4", "deserialize": "#ff7f0e", "serialize": "#ff7f0e",
                   "copy": "#2ca02c", "fsync": "#9467bd", "wait": "#d62728", "other": "#bbbbbb",
                   "verify": "#8c564b", "launcher": "#dddddd"}


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


MAX_TIMELINES = 6  # configurations on one page of the restart timeline; more make more pages


def restart_timelines(groups: list[Group], phases: list[str]) -> list[Figure]:
    """The restart timeline of every configuration, MAX_TIMELINES to a page."""
    shown = []
    for g in groups:
        rec = next((r for run in reversed(g.runs) for r in reversed(run.summary.get("restarts") or [])
                    if isinstance(r, dict) and r.get("per_rank") and all("marks" in x for x in r["per_rank"])), None)
        if rec:
            shown.append((g, rec))
    pages = [shown[i:i + MAX_TIMELINES] for i in range(0, len(shown), MAX_TIMELINES)]
    return [_timeline_page(page, phases, (n, len(pages))) for n, page in enumerate(pages, 1)]


def restart_timeline(groups: list[Group], phases: list[str]) -> Figure | None:
    """The first page of the restart timeline (restart_timelines: every page), or None without per-rank marks."""
    return next(iter(restart_timelines(groups, phases)), None)


def _timeline_page(shown: list, phases: list[str], page: tuple[int, int] = (1, 1)) -> Figure:
    """One restart per configuration (its latest), every rank a row: the launcher, each phase, the verification,
    and inside the checkpoint load what the rank's main thread did (read+deserialize, copy, wait)."""
    heights = [1.0 + 0.35 * len(rec["per_rank"]) for _, rec in shown]
    fig = Figure(figsize=(11.0, 1.2 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False, height_ratios=heights)[:, 0]
    marks_order = [("process_start", "imports_done", "imports"), ("imports_done", "dist_init_done", "dist_init"),
                   ("dist_init_done", "model_built", "model_build"), ("model_built", "engine_initialized", "engine_init"),
                   ("engine_initialized", "checkpoint_loaded", "checkpoint_load"),
                   ("checkpoint_loaded", "first_step_done", "first_step")]
    colors = {p: PHASE_PALETTE[i % len(PHASE_PALETTE)] for i, p in enumerate(phases)}
    used: dict[str, object] = {}
    for ax, (g, rec) in zip(axes, shown, strict=True):
        ranks = sorted(rec["per_rank"], key=lambda r: r["rank"])
        t0 = min(r["marks"]["process_start"] for r in ranks if "process_start" in r["marks"])
        launch = rec.get("launch_start")
        lb = rec.get("load_breakdown") or {}
        for y, r in enumerate(ranks):
            m = r["marks"]
            if launch and "process_start" in m:
                used["launcher"] = ax.barh(y, m["process_start"] - launch, left=launch - t0, height=0.5,
                                           color=CATEGORY_COLORS["launcher"])
            for a, b, name in marks_order:
                if a in m and b in m:
                    used[name] = ax.barh(y, m[b] - m[a], left=m[a] - t0, height=0.5, color=colors.get(name, "C9"))
            if r.get("verify_seconds") and "checkpoint_loaded" in m:
                used["verify"] = ax.barh(y, r["verify_seconds"], left=m["checkpoint_loaded"] - t0, height=0.5,
                                         color=CATEGORY_COLORS["verify"], hatch="//")
            start = (lb.get("starts") or {}).get(str(r["rank"]), (lb.get("starts") or {}).get(r["rank"]))
            for cat, a, b in (lb.get("intervals") or {}).get(str(r["rank"]), []) or \
                    (lb.get("intervals") or {}).get(r["rank"], []):
                if start is not None:
                    name = "load: engine.load (read + deserialize)" if cat == "deserialize" else f"load: {cat}"
                    used[name] = ax.barh(y + 0.38, b - a, left=start + a - t0, height=0.22,
                                         color=CATEGORY_COLORS.get(cat, "black"))
        ax.set_yticks(range(len(ranks)), [f"rank {r['rank']}" for r in ranks], fontsize="small")
        ax.set_ylim(len(ranks) - 0.4, -0.6)
        ax.set_title(f"{g.full_label}: {rec.get('record')}{restart_where(rec)}", fontsize="medium", loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds since the first rank's process start")
    fig.legend(list(used.values()), [n.replace("_", " ") for n in used], loc="outside right upper", fontsize="small")
    fig.suptitle("Restart timeline per rank (one restart per configuration)"
                 + (f", page {page[0]} of {page[1]}" if page[1] > 1 else ""))
    _caption(fig, "wide bars: each rank's phases between its own marks; thin bars: inside the checkpoint load, what "
                  "the main thread did (docs/anatomy.md)")
    return fig


def step_timelines(groups: list[Group]) -> list[Figure]:
    """Every configuration's training steps over its checkpoint phase (its latest run), MAX_TIMELINES to a page."""
    shown = []
    for g in groups:
        run = next((r for r in reversed(g.runs) if (r.summary.get("training") or {}).get("step_seconds")), None)
        if run:
            shown.append((g, run.summary))
    pages = [shown[i:i + MAX_TIMELINES] for i in range(0, len(shown), MAX_TIMELINES)]
    return [_step_page(page, (n, len(pages))) for n, page in enumerate(pages, 1)]


def _step_page(shown: list, page: tuple[int, int]) -> Figure:
    """Rank 0's step seconds, step by step: the steps a flush was in flight in marked, each save after its step,
    the baseline step the training lost per save is measured against (docs/measurements.md#training-lost)."""
    fig = Figure(figsize=(11.0, 1.4 + 2.0 * len(shown)), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False)[:, 0]
    used: dict[str, object] = {}
    for ax, (g, summary) in zip(axes, shown, strict=True):
        tr, ck = summary["training"], summary.get("checkpoint") or {}
        steps, seconds, busy = tr["step_numbers"], tr["step_seconds"], tr.get("step_in_flight") or []
        used["step"] = ax.plot(steps, seconds, color="C0", marker="o", markersize=3, linewidth=1)[0]
        flushed = [(x, y) for x, y, b in zip(steps, seconds, busy, strict=False) if b]
        if flushed:
            used["step with a flush in flight"] = ax.scatter(*zip(*flushed, strict=True), color="C1", zorder=3, s=18)
        for i, save in enumerate(ck.get("saves") or []):
            line = ax.axvline(save["step"] + 0.5, color="C3", linestyle="--", linewidth=0.8)
            if i == 0:
                used["save (after its step)"] = line
        base = ((ck.get("training_lost") or {}).get("baseline_step") or {}).get("seconds")
        if base:
            used["baseline step (no flush in flight)"] = ax.axhline(base, color="grey", linewidth=0.8)
        lost = (ck.get("training_lost") or {}).get("per_save_seconds_median")
        ax.set_title(f"{g.full_label}" + (f": training lost per save, median {lost:.3f} s" if lost is not None
                                          else ""), fontsize="medium", loc="left")
        ax.set_ylabel("step (s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("training step (rank 0)")
    fig.legend(list(used.values()), list(used), loc="outside right upper", fontsize="small")
    fig.suptitle("Training step time over the checkpoint phase (one run per configuration)"
                 + (f", page {page[0]} of {page[1]}" if page[1] > 1 else ""))
    _caption(fig, "the first step is warm-up; docs/measurements.md#training-lost")
    return fig


SOURCE_COLORS = {"environment": "#1f77b4", "extension_cache": "#ff7f0e", "checkpoint": "#2ca02c",
                 "run_dir": "#9467bd", "system": "#8c564b", "pseudo": "#dddddd", "other": "#bbbbbb"}


def _latest_io(g: Group) -> dict | None:
    return next((r["io_sources"] for run in reversed(g.runs) for r in reversed(run.summary.get("restarts") or [])
                 if isinstance(r, dict) and isinstance(r.get("io_sources"), dict) and r["io_sources"].get("ranks")
                 and r["io_sources"].get("by_source", True)),
                None)


def restart_io(groups: list[Group], phases: list[str]) -> list[Figure]:
    """Each configuration's restart I/O per phase, stacked by source (its latest restart, per rank): metadata
    operations above, MiB read through read calls below (docs/measurements.md#io-by-source)."""
    shown = [(g, io) for g in groups if (io := _latest_io(g))]
    pages = [shown[i:i + MAX_TIMELINES] for i in range(0, len(shown), MAX_TIMELINES)]
    return [_io_page(page, phases, (n, len(pages))) for n, page in enumerate(pages, 1)]


def _io_page(shown: list, phases: list[str], page: tuple[int, int]) -> Figure:
    fig = Figure(figsize=(max(9.5, 3.2 + 2.6 * len(shown)), 6.4), layout="constrained")
    axes = fig.subplots(2, len(shown), squeeze=False)
    used: dict[str, object] = {}
    for col, (g, io) in enumerate(shown):
        n = io["ranks"]
        names = [p for p in phases if p in io["phases"]]
        found = {s for p in names for s in io["phases"][p]["sources"]}
        sources = [*(s for s in SOURCE_COLORS if s in found), *sorted(found - set(SOURCE_COLORS))]
        for row, (measure, scale, label) in enumerate((("ops", 1, "metadata operations per rank"),
                                                       ("read_bytes", 2**20, "MiB read per rank"))):
            ax = axes[row][col]
            bottoms = [0.0] * len(names)
            for source in sources:
                counts = [io["phases"][p]["sources"].get(source) or {} for p in names]
                heights = [(io_metadata_ops(c) if measure == "ops" else c.get("read_bytes", 0)) / n / scale
                           for c in counts]
                if any(heights):
                    used[source] = ax.bar(range(len(names)), heights, bottom=bottoms, width=0.6,
                                          color=SOURCE_COLORS.get(source, "#777777"))
                    bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
            ax.set_xticks(range(len(names)), [p.replace("_", " ") for p in names], fontsize="small", rotation=35,
                          ha="right", rotation_mode="anchor")
            ax.set_ylabel(label)
            ax.grid(axis="y", alpha=0.3)
            if row == 0:
                ax.set_title(textwrap.fill(g.label, 30), fontsize="medium", loc="left")  # what it differs in
    order = [s for s in SOURCE_COLORS if s in used] + [s for s in used if s not in SOURCE_COLORS]
    fig.legend([used[s] for s in order], [s.replace("_", " ") for s in order], title="source",
               loc="outside right upper", fontsize="small")
    common = common_label([g for g, _ in shown]) if len(shown) > 1 else ""
    fig.suptitle("Restart I/O by phase and source\n(latest restart of each configuration, per rank)"
                 + (f", page {page[0]} of {page[1]}" if page[1] > 1 else "") + (f"\nevery configuration: {common}"
                                                                                   if common else ""))
    _caption(fig, "metadata operations: opens (failed ones too), stat-family calls, listings; reads: through read "
             "calls (mapped libraries not included); docs/measurements.md#io-by-source")
    return fig


KIND_COLORS = {"import": "#1f77b4", "jit_op": "#ff7f0e", "process_group": "#2ca02c", "collective": "#98df8a",
               "cuda": "#d62728", "model": "#9467bd", "optimizer": "#c5b0d5", "checkpoint": "#8c564b",
               "training": "#e377c2", "launcher": "#7f7f7f", "harness": "#bcbd22", "other": "#17becf",
               "remainder": "#dddddd"}


def _attributed(groups: list[Group]) -> list[tuple[str, dict]]:
    """Every sampled restart of the groups (a run's restart-only re-runs side by side: another launcher, a warm
    extension cache, ...), labelled by configuration, record and what its launch differed in."""
    out = []
    for g in groups:
        mine = {(r.get("run_dir"), r.get("restart_record")) for r in g.rows}  # re-runs may be other configurations
        for run in g.runs:
            for rec in run.summary.get("restarts") or []:
                if not isinstance(rec, dict) or (str(run.dir), rec.get("record")) not in mine:
                    continue
                att = rec.get("attribution")
                if att and att.get("sampled") and att.get("phases"):
                    env = (rec.get("environment_cache") or {}).get("observed")
                    how = ", ".join(x for x in (f"launcher {rec.get('launcher')}" if rec.get("launcher") else "",
                                                f"environment {env}" if env else "",
                                                "staged" if rec.get("staging") else "") if x)
                    out.append((f"{g.label}: {rec.get('record')}" + (f" ({how})" if how else ""), att))
    return out


def restart_causes(groups: list[Group]) -> list[Figure]:
    """Where each restart phase's seconds went (attribution=): per sampled restart, a bar per phase split by the kind
    of its causes, the largest named on its bar; one x scale across the page, so restarts compare."""
    shown = _attributed(groups)
    pages = [shown[i:i + MAX_TIMELINES] for i in range(0, len(shown), MAX_TIMELINES)]
    return [_causes_page(page, (n, len(pages))) for n, page in enumerate(pages, 1)]


def _causes_page(shown: list, page: tuple[int, int]) -> Figure:
    heights = [0.8 + 0.42 * len(att["phases"]) for _, att in shown]
    fig = Figure(figsize=(11.0, 1.4 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False, height_ratios=heights, sharex=True)[:, 0]
    used: dict[str, object] = {}
    longest = max(p["seconds"] for _, att in shown for p in att["phases"].values())
    for ax, (label, att) in zip(axes, shown, strict=True):
        names = list(att["phases"])
        for y, name in enumerate(names):
            p = att["phases"][name]
            by_kind: dict[str, float] = {}
            for c in p["causes"]:
                by_kind[c["kind"]] = by_kind.get(c["kind"], 0.0) + c["seconds"]
            by_kind["remainder"] = p["remainder_seconds"]
            left = 0.0
            for kind, color in KIND_COLORS.items():
                width = by_kind.get(kind, 0.0)
                if width > 0:
                    used[kind] = ax.barh(y, width, left=left, height=0.6, color=color)
                    left += width
            top = p["causes"][0] if p["causes"] else None
            room = int(p["seconds"] / longest * (fig.get_size_inches()[0] - BESIDE_IN) / XSMALL_CHAR_IN)
            if top and room >= 15:  # on its bar, as much of it as the bar holds (white beyond a bar was cut off)
                ax.text(0.01 * longest, y, textwrap.shorten(top["cause"], min(60, room)), va="center",
                        fontsize="x-small", bbox={"facecolor": "white", "alpha": 0.75, "linewidth": 0, "pad": 1})
        ax.set_yticks(range(len(names)), [n.replace("_", " ") for n in names], fontsize="small")
        ax.set_ylim(len(names) - 0.4, -0.6)
        ax.set_title(label, fontsize="medium", loc="left")  # wrapped to the axes by layout.fit
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds (each phase on its slowest rank; the launcher before any rank starts)")
    order = [k for k in KIND_COLORS if k in used]
    fig.legend([used[k] for k in order], [k.replace("_", " ") for k in order], title="cause", loc="outside right upper",
               fontsize="small")
    fig.suptitle("Where each restart phase went (attribution=, sampled restarts)"
                 + (f", page {page[0]} of {page[1]}" if page[1] > 1 else ""))
    _caption(fig, "each bar: a phase's measured seconds split by the kind of its causes; remainder: unnamed samples "
                  "and time the sampler did not see; text: the largest cause (docs/attribution.md)")
    return fig


def reshard_seconds(groups: list[Group], phases: list[str]) -> Figure | None:
    """Each restart at another layout beside its run's same-layout restart: conversion, then the restart's phases."""
    bars: list[tuple[str, dict]] = []
    for g in groups:
        if not g.resharded:
            continue
        same = [r for r in g.rows if r.get("restart_record")]
        if same:
            bars.append((f"{g.tick}\n{same[-1].get('restart_layout_saved') or 'own layout'}", same[-1]))
        bars += [(f"{g.tick}\n-> {r['restart_layout_loaded']}", r) for r in g.resharded]
    if not bars:
        return None
    fig, ax = _figure(len(bars), height=4.8)
    segments = [("conversion_seconds", "conversion")] + [(f"phase_{p}_seconds", p) for p in phases]
    bottoms = [0.0] * len(bars)
    for i, (column, name) in enumerate(segments):
        # a reused conversion was paid by an earlier restart: drawn only where it ran
        heights = [0.0 if name == "conversion" and r.get("conversion_reused") in (True, "true") else
                   num(r.get(column)) or 0.0 for _, r in bars]
        if not any(heights):
            continue
        color = "#444444" if name == "conversion" else PHASE_PALETTE[(i - 1) % len(PHASE_PALETTE)]
        ax.bar(range(len(bars)), heights, bottom=bottoms, width=0.6, label=name.replace("_", " "), color=color)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(bars)), [label for label, _ in bars])
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_ylabel("seconds")
    _title(ax, "Restart at another layout:\nconversion and restart phases (slowest rank)")
    legend(ax)
    _caption(fig, "first bar of each run: its restart at the layout that wrote the checkpoint; conversion is "
                  "paid once per checkpoint and reused by later restarts (shown where it ran)")
    return fig


PREDICTION_BAND = 0.15  # the predictor's goal (docs/prediction.md): within 15% of what the run measures


def measured_vs_predicted(series: list[tuple[list[tuple[float, float]], dict, str]], title: str, xlabel: str,
                          ylabel: str) -> Figure:
    """(measured, predicted) points, log-log, on the diagonal where a prediction is exact, with the goal's band; each
    series its points, its scatter() style and its legend label (a series without points labels a legend entry)."""
    fig = Figure(figsize=(8.5, 5.6), layout="constrained")
    ax = fig.add_subplot()
    values = [x for pts, _, _ in series for pair in pts for x in pair]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="exact")
    below, above = 1 - PREDICTION_BAND, 1 + PREDICTION_BAND
    ax.fill_between([lo, hi], [lo * below, hi * below], [lo * above, hi * above], color="0.85",
                    label=f"+-{PREDICTION_BAND:.0%}")
    for pts, style, label in series:
        ax.scatter([m for m, _ in pts], [p for _, p in pts], label=label, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    _title(ax, title)
    legend(ax)
    return fig


def prediction(groups: list[Group]) -> Figure | None:
    """Predicted against measured seconds, every phase of every run that carries a prediction (log-log): on the
    diagonal a prediction is exact; the band is +-15%."""
    points: dict[str, list[tuple[float, float]]] = {}
    calibrations = set()
    for g in groups:
        for run in g.runs:
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
    fig = measured_vs_predicted(series, "Predicted vs measured seconds, per phase and run", "measured (s)",
                                "predicted before launch (s)")
    names = ", ".join(sorted(calibrations)) or "?"
    _caption(fig, "each point: one phase of one run, predicted before launch (docs/prediction.md); calibration "
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
    if not figures:
        return {name: None}
    return {name if n == 1 else f"{name}_{n}": fig for n, fig in enumerate(figures, 1)}


def all_figures(groups: list[Group], phases: list[str]) -> dict[str, Figure | None]:
    """Every figure by file name (unit in the name), its words fitted inside it (layout.fit); None where no run has
    its data."""
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
        **_pages("restart_timeline_seconds", restart_timelines(groups, phases)),
        **_pages("step_timeline_seconds", step_timelines(groups)),
        **_pages("restart_io_by_source", restart_io(groups, phases)),
        **_pages("restart_causes_seconds", restart_causes(groups)),
        "reshard_seconds": reshard_seconds(groups, phases),
        "prediction_seconds": prediction(groups),
        **_pages("crossover_seconds", crossover.figures(groups)),
    }
    return {name: fig if fig is None else fit(fig) for name, fig in figures.items()}
