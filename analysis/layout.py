"""What keeps a figure's words inside it (axes as wide as their slots need, legends beside the axes, titles and
captions wrapped, configuration keys where labels would overlap, a figure as tall as its legend), and the charts
the report and the study draw with it: grouped and stacked bars, measured against predicted, a byte axis's unit."""

from __future__ import annotations

import io
import textwrap

from matplotlib.figure import Figure

from analysis.table import Stat, common_label

FIGURE_DPI = 110
LEGEND = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.0, 1.0)}  # outside: never on a bar
LEGEND_CHARS = 40  # a legend entry wraps here: the legend beside the axes takes at most about 2.7 in
TICK_CHARS = 36  # a tick label on the y axis wraps here
EDGE_IN = 0.1  # kept between a title and the edge of its axes
LINE_IN = 0.2  # a line of a title
TITLE_IN = 0.8  # beside a legend: the figure's title above it, a margin below
MAX_WIDTH_IN = 20.0
CHAR_IN = 0.075  # width of a tick label's character at the default size, inches: whether labels fit their slots
UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
LOG_SPAN = 100  # a figure whose values span more than this factor gets a log axis (else a linear one from 0)
PREDICTION_BAND = 0.15  # the predictor's goal (docs/prediction.md): within 15% of what the run measures
# Phases in light colours, what happens inside the load in strong ones, so the two never read as the same.
PHASE_PALETTE = ("#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5", "#c49c94")
CATEGORY_COLORS = {"read": "#1f77b4", "write": "#1f77b4", "deserialize": "#ff7f0e", "serialize": "#ff7f0e",
                   "copy": "#2ca02c", "fsync": "#9467bd", "wait": "#d62728", "other": "#bbbbbb",
                   "verify": "#8c564b", "launcher": "#dddddd"}


def wrap(text: str, chars: int) -> str:
    """text on lines of at most chars characters (its own line breaks kept)."""
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines())


def paged(items: list, per_page: int, draw) -> list[Figure]:
    """draw(page, (n, pages)) for each page of per_page items."""
    pages = [items[i:i + per_page] for i in range(0, len(items), per_page)]
    return [draw(page, (n, len(pages))) for n, page in enumerate(pages, 1)]


def bar_figure(n_categories: int, height: float = 4.2) -> tuple[Figure, object]:
    """A figure and its axes for n categories of bars, wide enough for their tick labels up to a screen's width."""
    fig = Figure(figsize=(min(MAX_WIDTH_IN, max(6.0, 1.6 + 1.5 * n_categories)), height), layout="constrained")
    ax = fig.add_subplot(axisbelow=True)
    if 1.6 + 1.5 * n_categories > MAX_WIDTH_IN:
        ax.tick_params(axis="x", labelsize="x-small")
    ax.grid(axis="y", alpha=0.3)
    return fig, ax


def caption(fig: Figure, text: str, groups: list | None = None) -> None:
    """Small grey note under the axes (a supxlabel, so the layout makes room for it); with groups, also what every
    configuration shown shares (their labels leave it out), and where configuration keys on the axis are named."""
    common = common_label(groups) if groups else ""
    keyed = "\nC1, C2, ...: the configurations table of report.md names each" if getattr(fig, "keyed", False) else ""
    text += (f"\nevery configuration: {common}" if common else "") + keyed
    width = max(40, int(fig.get_size_inches()[0] * 15))  # x-small characters an inch: a longer line was cut off
    fig.supxlabel(wrap(text, width), fontsize="x-small", color="0.4")


def ticks(fig: Figure, gs: list) -> list[str]:
    """Each configuration's label under its slot, or its key (C1, ...) where the labels would overlap (see caption)."""
    slot = fig.get_size_inches()[0] * 0.7 / max(1, len(gs))
    widest = max((len(line) for g in gs for line in g.tick.splitlines()), default=0) * CHAR_IN
    if widest <= slot:
        return [g.tick for g in gs]
    fig.keyed = True
    return [g.key for g in gs]


def named(fig: Figure, gs: list) -> str:
    """The configurations as the figure's axis names them (keys, or labels), for its caption."""
    return ", ".join(g.key if getattr(fig, "keyed", False) else g.label for g in gs)


def title(ax, text: str) -> None:
    """A figure's title on as many lines as its width needs (a title longer than the axes was cut off)."""
    ax.set_title(wrap(text, max(30, int(ax.figure.get_size_inches()[0] * 11))), loc="left")


def legend(ax, **kwargs) -> None:
    """The axes' legend beside it, each entry wrapped to LEGEND_CHARS."""
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [wrap(label, LEGEND_CHARS) for label in labels], **{**LEGEND, **kwargs})


def fit(fig: Figure) -> Figure:
    """Measured on the drawn layout: every subplot title wrapped to end at its axes' right edge (a legend is beside
    it), and the figure made as tall as its tallest legend. Returns fig."""
    fig.draw_without_rendering()
    added = 0  # title lines the wrapping added: the figure grows by them
    for ax in fig.axes:
        end = ax.get_window_extent().x1 - EDGE_IN * fig.dpi
        for title in (ax.title, ax._left_title):  # matplotlib keeps a title set with loc="left" apart
            text = title.get_text()
            room, used = end - title.get_window_extent().x0, title.get_window_extent().width
            if text and used > room > 0:
                longest = max(len(line) for line in text.splitlines())
                wrapped = wrap(text, max(20, int(0.95 * longest * room / used)))
                added += wrapped.count("\n") - text.count("\n")
                title.set_text(wrapped)
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    height = max((lg.get_window_extent().height for lg in legends), default=0) / fig.dpi + TITLE_IN
    width, now = fig.get_size_inches()
    fig.set_size_inches(width, max(now + added * LINE_IN, height))
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI)
    return buf.getvalue()


def pngs(figures: dict[str, Figure | None]) -> tuple[dict[str, bytes], list[str]]:
    """Each figure's PNG bytes by name, and the names without data (None)."""
    return {k: png_bytes(v) for k, v in figures.items() if v is not None}, [k for k, v in figures.items() if v is None]


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit that keeps the largest value readable (at least 1 of it)."""
    return next(((name, size) for name, size in UNITS if largest >= size), ("bytes", 1))


def _slots(ax, labels: list[str]) -> None:
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)


def grouped_bars(ax, categories: list[str], series: dict[str, list[Stat | None]], scale: float = 1.0,
                 value_format: str | None = None) -> None:
    """One bar per (category, series) that has a value, median height, min-max whisker when n > 1. Within a
    category the bars present share its width, so a category with one series gets one centred bar."""
    present = [[name for name, stats in series.items() if stats[j] is not None] for j in range(len(categories))]
    for i, (name, stats) in enumerate(series.items()):
        pts = [(j - 0.4 + 0.8 / len(present[j]) * (present[j].index(name) + 0.5), s)
               for j, s in enumerate(stats) if s is not None]
        bars = ax.bar([x for x, _ in pts], [s.median / scale for _, s in pts], label=name, color=f"C{i}",
                      width=[0.8 / len(present[round(x)]) * 0.95 for x, _ in pts])
        if value_format:
            ax.bar_label(bars, fmt=value_format, fontsize="small", padding=2)
        if reps := [(x, s) for x, s in pts if s.n > 1]:
            ax.errorbar([x for x, _ in reps], [s.median / scale for _, s in reps], yerr=[
                [(s.median - s.min) / scale for _, s in reps], [(s.max - s.median) / scale for _, s in reps]],
                fmt="none", ecolor="black", capsize=4, elinewidth=1.2)
    _slots(ax, categories)


def stacked_bars(ax, labels: list[str], segments: list[tuple[str, list[float], str]]) -> None:
    """One bar per label, stacked from the (name, heights, colour) segments in their order, each in the legend."""
    bottoms = [0.0] * len(labels)
    for name, heights, color in segments:
        ax.bar(range(len(labels)), heights, bottom=bottoms, width=0.6, label=name, color=color)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    _slots(ax, labels)


def measured_vs_predicted(series: list[tuple[list[tuple[float, float]], dict, str]], text: str, xlabel: str,
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
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3, which="both")
    title(ax, text)
    legend(ax)
    return fig
