"""The kinds of chart the report and the study's table draw: bars grouped per category with whiskers, stacked bars,
measured against predicted on log-log axes; and the binary unit that keeps a byte axis readable."""

from __future__ import annotations

from matplotlib.figure import Figure

from analysis.layout import legend, title
from analysis.table import Stat

UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
LOG_SPAN = 100  # a figure whose values span more than this factor gets a log axis (else a linear one from 0)
PREDICTION_BAND = 0.15  # the predictor's goal (docs/prediction.md): within 15% of what the run measures
# Phases in light colours, what happens inside the load in strong ones, so the two never read as the same.
PHASE_PALETTE = ("#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5", "#c49c94")
CATEGORY_COLORS = {"read": "#1f77b4", "write": "#1f77b4", "deserialize": "#ff7f0e", "serialize": "#ff7f0e",
                   "copy": "#2ca02c", "fsync": "#9467bd", "wait": "#d62728", "other": "#bbbbbb",
                   "verify": "#8c564b", "launcher": "#dddddd"}


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit that keeps the largest value readable (at least 1 of it)."""
    for name, size in UNITS:
        if largest >= size:
            return name, size
    return "bytes", 1


def _slots(ax, labels: list[str]) -> None:
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)


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
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    title(ax, text)
    legend(ax)
    return fig
