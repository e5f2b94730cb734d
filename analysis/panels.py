"""Figures of one panel per configuration, MAX_TIMELINES configurations to a page (restart timelines, steps, I/O by
source, causes), or per family of runs (the crossover, docs/prediction.md#the-crossover); each function returns
the pages (an empty list when no run has the data)."""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

from analysis.layout import CATEGORY_COLORS, PHASE_PALETTE, caption, paged, wrap
from analysis.table import Group, common_label, get, num
from restart_harness import schema
from restart_harness.results.views import CheckpointView, LostView
from restart_harness.schema import CROSSOVER_LOAD, GIB, PHASE_NAMES, RESTART_PHASES, io_metadata_ops

XSMALL_CHAR_IN = 0.06  # width of an x-small character, inches
BESIDE_IN = 3.6  # of a page's width, what its y labels and legend take


def _page(fig: Figure, used: dict[str, object], heading: str, page: tuple[int, int], note: str, after: str = "",
          **kwargs) -> Figure:
    """fig with its legend beside its panels (an entry per name used), its title and page number, its caption."""
    fig.legend(list(used.values()), [n.replace("_", " ") for n in used], loc="outside right upper", fontsize="small",
               **kwargs)
    fig.suptitle(heading + (f", page {page[0]} of {page[1]}" if page[1] > 1 else "") + after)
    caption(fig, note)
    return fig


MAX_TIMELINES = 6  # configurations on one page of the restart timeline; more make more pages


def restart_timelines(groups: list[Group], phases: list[str]) -> list[Figure]:
    """The restart timeline of every configuration, MAX_TIMELINES to a page."""
    shown = [(g, rec) for g in groups if (rec := next((
        r for run in reversed(g.runs) for r in reversed(run.view.restarts)
        if r.per_rank and all("marks" in x for x in r.per_rank)), None))]
    return paged(shown, MAX_TIMELINES, lambda page, n: _timeline_page(page, phases, n))


def restart_timeline(groups: list[Group], phases: list[str]) -> Figure | None:
    """The first page of the restart timeline (restart_timelines: every page), or None without per-rank marks."""
    return next(iter(restart_timelines(groups, phases)), None)


def _timeline_page(shown: list, phases: list[str], page: tuple[int, int] = (1, 1)) -> Figure:
    """One restart per configuration (its latest), every rank a row: the launcher, each phase, the verification,
    and inside the checkpoint load what the rank's main thread did (read+deserialize, copy, wait)."""
    heights = [1.0 + 0.35 * len(rec.per_rank) for _, rec in shown]
    fig = Figure(figsize=(11.0, 1.2 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False, height_ratios=heights)[:, 0]
    colors = {p: PHASE_PALETTE[i % len(PHASE_PALETTE)] for i, p in enumerate(phases)}
    used: dict[str, object] = {}
    for ax, (g, rec) in zip(axes, shown, strict=True):
        ranks = sorted(rec.per_rank, key=lambda r: r["rank"])
        t0 = min(r["marks"]["process_start"] for r in ranks if "process_start" in r["marks"])
        launch, lb = rec.launch_start, rec.load_breakdown or {}
        for y, r in enumerate(ranks):
            m = r["marks"]
            if launch and "process_start" in m:
                used["launcher"] = ax.barh(y, m["process_start"] - launch, left=launch - t0, height=0.5,
                                           color=CATEGORY_COLORS["launcher"])
            for name, a, b in RESTART_PHASES:
                if a in m and b in m:
                    used[name] = ax.barh(y, m[b] - m[a], left=m[a] - t0, height=0.5, color=colors.get(name, "C9"))
            if r.get("verify_seconds") and "checkpoint_loaded" in m:
                used["verify"] = ax.barh(y, r["verify_seconds"], left=m["checkpoint_loaded"] - t0, height=0.5,
                                         color=CATEGORY_COLORS["verify"], hatch="//")
            starts, spans = lb.get("starts") or {}, lb.get("intervals") or {}  # keys: str in JSON, int in memory
            start = starts.get(str(r["rank"]), starts.get(r["rank"]))
            for cat, a, b in (spans.get(str(r["rank"])) or spans.get(r["rank"]) or []) if start is not None else ():
                name = "load: engine.load (read + deserialize)" if cat == "deserialize" else f"load: {cat}"
                used[name] = ax.barh(y + 0.38, b - a, left=start + a - t0, height=0.22,
                                     color=CATEGORY_COLORS.get(cat, "black"))
        ax.set_yticks(range(len(ranks)), [f"rank {r['rank']}" for r in ranks], fontsize="small")
        ax.set_ylim(len(ranks) - 0.4, -0.6)
        ax.set_title(f"{g.full_label}: {rec.record}{rec.where()}", fontsize="medium", loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds since the first rank's process start")
    return _page(fig, used, "Restart timeline per rank (one restart per configuration)", page, "wide bars: each "
                 "rank's phases between its own marks; thin bars: inside the checkpoint load, what the main thread did "
                 "(docs/anatomy.md)")


def step_timelines(groups: list[Group]) -> list[Figure]:
    """Every configuration's training steps over its checkpoint phase (its latest run), MAX_TIMELINES to a page."""
    shown = [(g, run.view) for g in groups if (run := next(
        (r for r in reversed(g.runs) if r.view.training and r.view.training.step_seconds), None))]
    return paged(shown, MAX_TIMELINES, _step_page)


def _step_page(shown: list, page: tuple[int, int]) -> Figure:
    """Rank 0's step seconds, step by step: the steps a flush was in flight in marked, each save after its step,
    the baseline step the training lost per save is measured against (docs/measurements.md#training-lost)."""
    fig = Figure(figsize=(11.0, 1.4 + 2.0 * len(shown)), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False)[:, 0]
    used: dict[str, object] = {}
    for ax, (g, summary) in zip(axes, shown, strict=True):
        tr, ck = summary.training, summary.checkpoint or CheckpointView()
        steps, seconds, busy = tr.step_numbers, tr.step_seconds, tr.step_in_flight or []
        used["step"] = ax.plot(steps, seconds, color="C0", marker="o", markersize=3, linewidth=1)[0]
        if flushed := [(x, y) for x, y, b in zip(steps, seconds, busy, strict=False) if b]:
            used["step with a flush in flight"] = ax.scatter(*zip(*flushed, strict=True), color="C1", zorder=3, s=18)
        for i, save in enumerate(ck.saves or ()):
            line = ax.axvline(save.step + 0.5, color="C3", linestyle="--", linewidth=0.8)
            if i == 0:
                used["save (after its step)"] = line
        lost = ck.training_lost or LostView()
        if base := (lost.baseline_step or {}).get("seconds"):
            used["baseline step (no flush in flight)"] = ax.axhline(base, color="grey", linewidth=0.8)
        lost = lost.per_save_seconds_median
        ax.set_title(f"{g.full_label}" + (f": training lost per save, median {lost:.3f} s" if lost is not None
                                          else ""), fontsize="medium", loc="left")
        ax.set(ylabel="step (s)", ylim=(0, None))
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("training step (rank 0)")
    return _page(fig, used, "Training step time over the checkpoint phase (one run per configuration)", page,
                 "the first step is warm-up; docs/measurements.md#training-lost")


SOURCE_COLORS = {"environment": "#1f77b4", "extension_cache": "#ff7f0e", "checkpoint": "#2ca02c",
                 "run_dir": "#9467bd", "system": "#8c564b", "pseudo": "#dddddd", "other": "#bbbbbb"}


def restart_io(groups: list[Group], phases: list[str]) -> list[Figure]:
    """Each configuration's latest restart's I/O per phase and rank, stacked by source (operations above, MiB below)."""
    shown = [(g, io) for g in groups if (io := next((x for run in reversed(g.runs) for r in reversed(run.view.restarts)
                                                     if (x := r.io_by_source())), None))]
    return paged(shown, MAX_TIMELINES, lambda page, n: _io_page(page, phases, n))


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
    common = common_label([g for g, _ in shown]) if len(shown) > 1 else ""
    return _page(fig, {s: used[s] for s in order}, "Restart I/O by phase and source\n(latest restart of each "
                 "configuration, per rank)", page, "metadata operations: opens (failed ones too), stat-family calls, "
                 "listings; reads: through read calls (mapped libraries not included); "
                 "docs/measurements.md#io-by-source",
                 f"\nevery configuration: {common}" if common else "", title="source")


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
            for rec in run.view.restarts:
                att = rec.attribution
                if (str(run.dir), rec.record) in mine and att and att.get("sampled") and att.get("phases"):
                    env = (rec.environment_cache or {}).get("observed")
                    how = ", ".join(x for x in (f"launcher {rec.launcher}" if rec.launcher else "",
                                                f"environment {env}" if env else "", "staged" if rec.staging else "")
                                    if x)
                    out.append((f"{g.label}: {rec.record}" + (f" ({how})" if how else ""), att))
    return out


def restart_causes(groups: list[Group]) -> list[Figure]:
    """Where each restart phase's seconds went (attribution=): per sampled restart, a bar per phase split by the kind
    of its causes, the largest named on its bar; one x scale across the page, so restarts compare."""
    return paged(_attributed(groups), MAX_TIMELINES, _causes_page)


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
    return _page(fig, {k: used[k] for k in KIND_COLORS if k in used}, "Where each restart phase went (attribution=, "
                 "sampled restarts)", page, "each bar: a phase's measured seconds split by the kind of its causes; "
                 "remainder: unnamed samples and time the sampler did not see; text: the largest cause "
                 "(docs/attribution.md)", title="cause")


CURVE_COLORS = {"restart_launch_seconds": "#bbbbbb",
                **{f"restart_{p}_seconds": f"C{i}" for i, p in enumerate(PHASE_NAMES)}}
CROSSOVERS = 3  # families on one page of the crossover figure


def _short(phase: str) -> str:
    return phase.removeprefix("restart_").removesuffix("_seconds").replace("_", " ")


def _crossover(run) -> dict | None:
    c = get(run.summary, "prediction", "crossover")
    return c if isinstance(c, dict) and c.get("curve") else None


def families(groups: list[Group]) -> list[tuple[str, list]]:
    """Runs that carry a crossover, by what their family keeps (everything but the model's size), first-seen order."""
    out: dict[str, list] = {}
    for run in (run for g in groups for run in g.runs if _crossover(run)):
        s = run.spec
        key = ", ".join(x for x in (schema.layout_label(s), schema.engine_label(s),
                                    "emulated" if s.get("emulate") else "", f"launcher {s.get('launcher')}",
                                    f"cache {s.get('cache')}", str(s.get("device") or "")) if x)
        out.setdefault(key, []).append(run)
    return list(out.items())


def _bytes(run) -> float | None:
    return num(get(run.summary, "checkpoint", "bytes")) or num(_crossover(run).get("run_checkpoint_bytes"))


def _crossover_panel(ax, name: str, runs: list) -> None:
    shown = max(runs, key=lambda r: (_bytes(r) or 0, r.dir.name))  # the largest checkpoint: nearest the crossover
    c = _crossover(shown)
    xs = [b / GIB for b in c["curve"]["checkpoint_bytes"]]
    sizes = [b for b in (_bytes(r) for r in runs) if b]
    marks = [b for b in (c.get("crossover_checkpoint_bytes"), c.get("load_largest_until_bytes")) if b]
    lo = max(xs[0], min([*sizes, *marks]) / GIB / 100)
    hi = min(xs[-1], max([*sizes, *marks]) / GIB * 100)
    for phase, ys in c["curve"]["seconds"].items():
        ax.plot(xs, ys, color=CURVE_COLORS.get(phase, "black"), linewidth=2.2 if phase == CROSSOVER_LOAD else 1.3,
                label=_short(phase))
    for phase in c["curve"]["seconds"]:
        pts = [(_bytes(r) / GIB, num(get(r.summary, "prediction", "phases", phase, "measured"))) for r in runs
               if _bytes(r)]
        pts = [(x, y) for x, y in pts if y and y > 0]
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], color=CURVE_COLORS.get(phase, "black"), s=26,
                       zorder=4, edgecolors="black", linewidths=0.5, marker="D" if phase == CROSSOVER_LOAD else "o",
                       label=f"measured {_short(phase)}")
    cross, until = c.get("crossover_checkpoint_bytes"), c.get("load_largest_until_bytes")
    if cross:
        ax.axvline(cross / GIB, color="black", linestyle="--", linewidth=1,
                   label=f"crossover {cross / GIB:,.2f} GiB (load largest from here)")
    if until:
        ax.axvline(until / GIB, color="black", linestyle=":", linewidth=1, label=f"until {until / GIB:,.2f} GiB")
    seen = [y for ys in c["curve"]["seconds"].values() for x, y in zip(xs, ys) if lo <= x <= hi and y and y > 0]
    seen += [y for col in ax.collections for _, y in col.get_offsets()]
    ax.set(xscale="log", yscale="log", xlim=(lo, hi))
    if seen:
        ax.set_ylim(min(seen) / 2, max(seen) * 2)
    ax.set(xlabel="checkpoint size (GiB, all ranks' files)", ylabel="seconds")
    ax.grid(alpha=0.3, which="both")
    where = (f"crossover {cross / GIB:,.2f} GiB, overtaking {_short(c['overtakes'])}" if cross else
             f"no crossover in range: {c['status'].replace('_', ' ')}")
    title = f"{name}: {where}\n(curves: {shown.summary.get('run_id') or shown.dir.name})"
    ax.set_title(wrap(title, 95), loc="left", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def crossover_figures(groups: list[Group]) -> list[Figure]:
    """crossover_seconds: a panel per family, CROSSOVERS panels a page; [] where no run carries a crossover."""
    return paged(families(groups), CROSSOVERS, lambda page, _: _crossover_page(page))


def _crossover_page(page: list) -> Figure:
    fig = Figure(figsize=(10.5, 1.2 + 4.2 * len(page)), layout="constrained")
    for i, (name, runs) in enumerate(page):
        _crossover_panel(fig.add_subplot(len(page), 1, i + 1), name, runs)
    fig.supxlabel(textwrap.fill(
        "lines: each restart phase predicted before launch along the family of the run named in the title (its model's "
        "size changed: parameters and checkpoint bytes in proportion; layout, files, tokens per step and storage "
        "kept); points: every run's measured phases at its own checkpoint size; dashed: the crossover, from which the "
        "predicted load is the largest phase (docs/prediction.md#the-crossover)", 150), fontsize="x-small", color="0.4")
    return fig


def crossover_rows(groups: list[Group]) -> list[list[str]]:
    """Per configuration: its checkpoint, its latest run's crossover, and each run's side, predicted and measured."""
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
