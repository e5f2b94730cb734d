"""What keeps a figure's words inside it: legends of bounded width beside the axes, subplot titles wrapped to their
axes, a figure as tall as its legend. Without them a long configuration label made constrained layout give up (its
warning on the terminal, the axes collapsed), a title ran under the figure's legend and a legend's last entries were
cut off."""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

LEGEND = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.0, 1.0)}  # outside: never on a bar
LEGEND_CHARS = 40  # a legend entry wraps here: the legend beside the axes takes at most about 2.7 in
TICK_CHARS = 36  # a tick label on the y axis wraps here
EDGE_IN = 0.1  # kept between a title and the edge of its axes
LINE_IN = 0.2  # a line of a title
TITLE_IN = 0.8  # beside a legend: the figure's title above it, a margin below


def wrap(text: str, chars: int) -> str:
    """text on lines of at most chars characters (its own line breaks kept)."""
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines())


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
    now += added * LINE_IN
    fig.set_size_inches(width, max(now, height))
    return fig
