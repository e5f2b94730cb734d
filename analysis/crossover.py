"""The crossover in the report (docs/prediction.md#the-crossover), read from summary.json's prediction.crossover:
each restart phase predicted along a run's family against the checkpoint's size, and the runs' measured phases."""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

from analysis.layout import paged, wrap
from analysis.table import Group, get, num
from restart_harness.schema import CROSSOVER_LOAD, GIB, PHASE_NAMES, engine_label, layout_label

COLORS = {"restart_launch_seconds": "#bbbbbb", **{f"restart_{p}_seconds": f"C{i}" for i, p in enumerate(PHASE_NAMES)}}
PER_PAGE = 3
CAPTION = ("lines: each restart phase predicted before launch along the family of the run named in the title (its "
           "model's size changed: parameters and checkpoint bytes in proportion; layout, files, tokens per step and "
           "storage kept); points: every run's measured phases at its own checkpoint size; dashed: the crossover, "
           "from which the predicted load is the largest phase (docs/prediction.md#the-crossover)")


def _short(phase: str) -> str:
    return phase.removeprefix("restart_").removesuffix("_seconds").replace("_", " ")


def _crossover(run) -> dict | None:
    c = get(run.summary, "prediction", "crossover")
    return c if isinstance(c, dict) and c.get("curve") else None


def families(groups: list[Group]) -> list[tuple[str, list]]:
    """Runs that carry a crossover, by what their family keeps (everything but the model's size), first-seen order."""
    out: dict[str, list] = {}
    for g in groups:
        for run in g.runs:
            if _crossover(run) is None:
                continue
            s = run.spec
            key = ", ".join(x for x in (layout_label(s), engine_label(s), "emulated" if s.get("emulate") else "",
                                        f"launcher {s.get('launcher')}", f"cache {s.get('cache')}",
                                        str(s.get("device") or "")) if x)
            out.setdefault(key, []).append(run)
    return list(out.items())


def _bytes(run) -> float | None:
    return num(get(run.summary, "checkpoint", "bytes")) or num(_crossover(run).get("run_checkpoint_bytes"))


def _panel(ax, name: str, runs: list) -> None:
    shown = max(runs, key=lambda r: (_bytes(r) or 0, r.dir.name))  # the largest checkpoint: nearest the crossover
    c = _crossover(shown)
    xs = [b / GIB for b in c["curve"]["checkpoint_bytes"]]
    sizes = [b for b in (_bytes(r) for r in runs) if b]
    marks = [b for b in (c.get("crossover_checkpoint_bytes"), c.get("load_largest_until_bytes")) if b]
    lo = max(xs[0], min([*sizes, *marks]) / GIB / 100)
    hi = min(xs[-1], max([*sizes, *marks]) / GIB * 100)
    for phase, ys in c["curve"]["seconds"].items():
        ax.plot(xs, ys, color=COLORS.get(phase, "black"), linewidth=2.2 if phase == CROSSOVER_LOAD else 1.3,
                label=_short(phase))
    for phase in c["curve"]["seconds"]:
        pts = [(_bytes(r) / GIB, num(get(r.summary, "prediction", "phases", phase, "measured"))) for r in runs
               if _bytes(r)]
        pts = [(x, y) for x, y in pts if y and y > 0]
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], color=COLORS.get(phase, "black"), s=26, zorder=4,
                       edgecolors="black", linewidths=0.5, marker="D" if phase == CROSSOVER_LOAD else "o",
                       label=f"measured {_short(phase)}")
    cross, until = c.get("crossover_checkpoint_bytes"), c.get("load_largest_until_bytes")
    if cross:
        ax.axvline(cross / GIB, color="black", linestyle="--", linewidth=1,
                   label=f"crossover {cross / GIB:,.2f} GiB (load largest from here)")
    if until:
        ax.axvline(until / GIB, color="black", linestyle=":", linewidth=1, label=f"until {until / GIB:,.2f} GiB")
    seen = [y for ys in c["curve"]["seconds"].values() for x, y in zip(xs, ys) if lo <= x <= hi and y and y > 0]
    seen += [y for col in ax.collections for _, y in col.get_offsets()]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    if seen:
        ax.set_ylim(min(seen) / 2, max(seen) * 2)
    ax.set_xlabel("checkpoint size (GiB, all ranks' files)")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, which="both")
    where = (f"crossover {cross / GIB:,.2f} GiB, overtaking {_short(c['overtakes'])}" if cross else
             f"no crossover in range: {c['status'].replace('_', ' ')}")
    title = f"{name}: {where}\n(curves: {shown.summary.get('run_id') or shown.dir.name})"
    ax.set_title(wrap(title, 95), loc="left", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def figures(groups: list[Group]) -> list[Figure]:
    """crossover_seconds: a panel per family, PER_PAGE panels a page; [] where no run carries a crossover."""
    return paged(families(groups), PER_PAGE, lambda page, _: _page(page))


def _page(page: list) -> Figure:
    fig = Figure(figsize=(10.5, 1.2 + 4.2 * len(page)), layout="constrained")
    for i, (name, runs) in enumerate(page):
        _panel(fig.add_subplot(len(page), 1, i + 1), name, runs)
    fig.supxlabel(textwrap.fill(CAPTION, 150), fontsize="x-small", color="0.4")
    return fig


def rows(groups: list[Group]) -> list[list[str]]:
    """Per configuration: its checkpoint, the crossover its latest run predicted, and each run's side, predicted and
    measured."""
    out = []
    for g in groups:
        checked = [(r, _crossover(r)) for r in g.runs if _crossover(r)]
        if not checked:
            continue
        run, c = checked[-1]
        cross = c.get("crossover_checkpoint_bytes")
        agree = [m.get("side_agrees") for _, x in checked if (m := x.get("measured") or {}).get("side_agrees")
                 is not None]
        measured = [(x.get("measured") or {}).get("largest_phase") for _, x in checked]
        out.append([g.label, f"{(_bytes(run) or 0) / GIB:,.3f}",
                    f"{cross / GIB:,.2f}" if cross else c["status"].replace("_", " "),
                    _short(c["overtakes"]) if cross else "-", _short(c.get("run_largest_phase") or "-"),
                    ", ".join(sorted({_short(m) for m in measured if m})) or "-",
                    f"{sum(agree)}/{len(agree)}" if agree else "-"])
    return out
