"""The one-screen summary printed at the end of a run."""

from __future__ import annotations

import statistics

from restart_harness import resolve
from restart_harness.files import kernel_memory
from restart_harness.results import attribution, io_sources, placement, save_memory, views
from restart_harness.schema import GIB, LOAD_CATEGORIES, MIB, PREDICTED_TOTAL, SAVE_CATEGORIES, count, span


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _when(base: views.BaselineView) -> str:
    """Which measurement an efficiency is against: when it was taken, and whether this run took it."""
    if not base.cached:
        return ", measured for this run"
    where = f" in {base.dir} (the same file system)" if base.dir else ""
    age = base.age_seconds
    return f", cached, measured {age / 3600:.1f} h before the run{where}" if age is not None else f", cached{where}"


def _storage_rows(name: str, req: dict | None, uploads: dict | None) -> list[tuple[str, str]]:
    """What the object store's client went through in a phase, when something failed (requests retried, throttled,
    operations failed), and the multipart uploads a failed save left, aborted."""
    rows = []
    if req and req["failed_requests"]:
        why = ", ".join(f"{n} {reason}" for reason, n in req["failures"].items())
        rows.append((name, (f"{req['requests']} requests, {req['failed_requests']} failed ({why}): "
                           f"{req['throttled_requests']} throttled, {req['retried_requests']} retried by the client "
                           f"in operations that succeeded, {req['failed_operations']} operations failed")))
    if uploads and (uploads["aborted"] or uploads["error"]):
        rows.append(("uploads", f"{len(uploads['aborted'])} incomplete multipart uploads aborted"
                                + (f"; not all could be: {uploads['error']}" if uploads["error"] else "")))
    return rows


def render(summary: dict) -> str:
    """The screen, block by block, each block's rows in order; then the terms its words used. It reads the summary
    through its typed views (results/views.py), which take summaries of every version."""
    s = views.SummaryView.of(summary)
    ck, rs, restarts = s.checkpoint, s.restart, s.restarts
    records = resolve.engine_class(s.spec.engine).records  # the engine's own rows
    rows = [*_run_rows(s), *_training_rows(s.training)]
    if ck.files:
        rows += _checkpoint_rows(ck, s.training.rss_growth, records)
    rows += _storage_rows("save requests", ck.storage_requests, ck.incomplete_uploads)
    if rs:
        rows += [*_relaunch_rows(rs, s.spec, restarts), *_load_rows(rs, records), *_restart_end_rows(rs)]
    # where the kernel hands free memory back to its hypervisor, why loads into fresh memory trail the ceiling
    fresh = kernel_memory.reporting_said((s.spec.host or {}).get("free_page_reporting_order"))
    rows += [*_baseline_rows(s.baseline, ck.efficiency or {}), *([("fresh memory", fresh)] if fresh else []),
             *_restart_rows(restarts), *_prediction_rows(s.prediction)]
    text = " ".join(f"{k} {v}" for k, v in rows)  # a row's name may be the term (ceiling)
    used = [(word, meaning) for word, meaning in TERMS if word in text]
    rows += [("terms" if i == 0 else "", f"{word}: {meaning}") for i, (word, meaning) in enumerate(used)]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _run_rows(s: views.SummaryView) -> list[tuple[str, str]]:
    """Which run, what it trained, on what layout, and how it ended."""
    spec, d = s.spec, s.spec.derived
    shrunk = f" (shrunk /{spec.shrink})" if d["shrunk"] else ""
    return [
        ("run", s.run_id),
        ("model", f"{spec.model}{shrunk}: {d['num_parameters'] / 1e6:,.2f} M parameters, {spec.precision}, "
                  f"seq {spec.seq_len}, global batch {d['global_batch']}"
                  + ("; EMULATED: no model, no training, the checkpoint's files written and read back"
                     if spec.emulate else "")),
        ("layout", f"tp={spec.tp} pp={spec.pp} dp={spec.dp} ({count(d['world_size'], 'rank')} on {spec.device}), "
                   f"engine {spec.engine}" + (f"; SUBSET: ranks 0-{d['launched_ranks'] - 1} ran, their files only"
                                              if spec.subset else "")),
        ("status", s.status["state"] + (f": {s.status['reason']}" if s.status["reason"] else ""))]


def _training_rows(tr: views.TrainingView) -> list[tuple[str, str]]:
    """The training steps' median, and with a flush in flight against without."""
    rows = ([("train step", f"median {_s(tr.step_seconds_median)} over {tr.steps} steps")]
            if tr.step_seconds_median is not None else [])
    if tr.steps_in_flight:
        rows.append(("overlap", (f"median step {_s(tr.step_seconds_median_in_flight)} with a flush in flight "
                                f"({tr.steps_in_flight} steps), {_s(tr.step_seconds_median_no_flush)} without")))
    return rows


def _checkpoint_rows(ck: views.CheckpointView, steps: dict | None, records) -> list[tuple[str, str]]:
    """The checkpoint: its files, per rank, each save, what the saves cost, the last save's anatomy and nodes."""
    kinds = ", ".join(f"{k} {v['files']}" for k, v in ck.by_kind.items() if v["files"])
    rows = [("checkpoint", f"{ck.tag}: {ck.files} files, {ck.bytes / MIB:,.2f} MiB ({kinds})")]
    if b := ck.bytes_per_rank:
        rows.append(("per rank", (f"max {b['max'] / MIB:,.2f} / min {b['min'] / MIB:,.2f} / "
                                 f"mean {b['mean'] / MIB:,.2f} MiB written")))
    rows += [*map(_save_row, ck.saves), *_lost_rows(ck), *_memory_rows(ck, steps, records)]
    last = ck.saves[-1] if ck.saves else views.SaveView()
    if last.breakdown:
        rows.append(("save anatomy", (f"{_anatomy(last.breakdown, SAVE_CATEGORIES)}  (s, {last.tag}, "
                                     f"slowest rank {last.breakdown['slowest_rank']})")))
    return rows + _node_rows("save by node", last.per_node, last.slowest_node, "durable_seconds", "bytes", "written")


def _save_row(save: views.SaveView) -> tuple[str, str]:
    t = save.throughput_mib_s
    return (f"save {save.tag}",
            f"blocking {_s(save.blocking_seconds)} ({t['blocking'] or 0:,.1f} MiB/s), "
            f"durable {_s(save.durable_seconds)} ({t['durable'] or 0:,.1f} MiB/s)"
            + (f", async: committed {_s(save.commit_seconds)}" if save.is_async else "")
            + (f"; sha256 read back after the commit in {_s(save.checksum_seconds)}"
               if save.checksum_seconds is not None else ""))


def _anatomy(bd: dict, categories: tuple[str, ...]) -> str:
    """A save's or a load's seconds by category, `-` where one was not measured."""
    return "  ".join(f"{c} {bd[f'{c}_seconds']:.3f}" if bd[f"{c}_seconds"] is not None else f"{c} -"
                     for c in categories)


def _relaunch_rows(rs: views.RestartView, spec: views.SpecView, restarts: tuple) -> list[tuple[str, str]]:
    """The latest restart: where it ran against where the checkpoint was saved, how long it took, its phases."""
    rows, layout, loaded = [], rs.layout or {}, rs.loaded or {}
    if layout and not rs.at_own_layout():
        read = (f": {loaded['files']} files, {loaded['bytes'] / MIB:,.2f} MiB" if loaded.get("files") else "")
        rows.append(("restarted at", (f"{layout['loaded']} ({rs.ranks} ranks), from {layout['saved']}; it loaded "
                                     f"{loaded.get('tag')}{read}")))
    until = "checkpoint loaded" if spec.emulate else "first step done"
    latest = f" (latest of {len(restarts)})" if len(restarts) > 1 else ""
    env, staged = (rs.environment_cache or {}).get("observed"), rs.staging
    rows.append(("restart", f"{rs.record}{latest}: {_s(rs.total_seconds)} process start -> {until} "
                            f"(+{_s(rs.launch_seconds)} launcher"
                            + (f", +{staged['seconds']:.3f} s staging the environment into "
                               f"{staged['filesystem']['type']}" if staged else "")
                            + f"); cache {(rs.cache or {}).get('observed', '-')}"
                            + (f", environment {env}" if env else "")))
    return [*rows, ("phases", "  ".join(f"{k} {v:.2f}" for k, v in rs.phases.items())),
            *attribution.attribution_rows(rs.attribution, rs.record), *io_sources.io_rows(rs.io_sources)]


def _load_rows(rs: views.RestartView, records) -> list[tuple[str, str]]:
    """The latest restart's checkpoint load: its throughput, the engine's own account, its anatomy."""
    rows, lb = [], rs.load_breakdown
    if rs.load_throughput_mib_s:
        sr = (lb or {}).get("storage_read")
        rows.append(("load", f"{_s(rs.load_seconds)} waited for ({rs.load_throughput_mib_s:,.1f} MiB/s)"
                             + (f"; storage read {sr['throughput_mib_s']:,.1f} MiB/s ({sr['bytes'] / MIB:,.2f} MiB "
                                f"read by all {count(rs.ranks, 'rank')}, over the slowest one's "
                                f"{sr['seconds']:.3f} s with a read in flight: rank {sr['slowest_rank']})"
                                if sr else "")))
    rows += records.restart_rows(rs.engine_load_statistics or {})
    if lb:
        rows.append(("load anatomy", f"{_anatomy(lb, LOAD_CATEGORIES)}  (s, slowest rank {lb['slowest_rank']})"))
    return rows


def _restart_end_rows(rs: views.RestartView) -> list[tuple[str, str]]:
    """The latest restart's nodes, memory peak, storage requests, and whether it restored the saved state."""
    rows = _node_rows("restart by node", rs.per_node, rs.slowest_node, "total_seconds", "read_bytes", "read")
    peak = max(((v["peak_rss_bytes_max"], k) for k, v in (rs.memory or {}).items()), default=None)
    if peak:
        rows.append(("memory", f"restart peak RSS {peak[0] / MIB:,.0f} MiB per rank, in {peak[1]}"))
    rows += _storage_rows("load requests", rs.storage_requests, rs.incomplete_uploads)
    verdict = "yes" if rs.verified else "NO: " + ", ".join(rs.differing[:3])
    rows.append(("verified", f"{verdict} ({count(rs.ranks, 'rank')}, {rs.verified_tensors} tensors)"
                             + (f"; before the launch {rs.integrity['files']} files matched their "
                                f"{rs.integrity['algorithm']} from the commit" if rs.integrity else "")))
    return rows


def _baseline_rows(base: views.BaselineView | None, eff: dict) -> list[tuple[str, str]]:
    """The storage baseline the efficiencies are against, and the storage's ceiling where one was probed."""
    if not base or not base.write_mib_s:
        return []
    pct = {k: "-" if v is None else f"{v:.0%}" for k, v in eff.items()}
    sp = base.spread
    spread = (f"; over {sp['repeats']} probes write {span(*sp['write_mib_s'], ',.0f')}, read "
              f"{span(*sp['read_mib_s'], ',.0f')}" if sp else "; one probe, no spread")
    rows = [("storage", (f"baseline write {base.write_mib_s:,.1f} / read {base.read_mib_s:,.1f} MiB/s "
                        f"({base.method}{_when(base)}{spread}); efficiency save "
                        f"{pct.get('save', '-')}, load {pct.get('load', '-')}"))]
    if c := base.ceiling:
        csp = c["spread"]
        rows.append(("ceiling", (f"write {c['write_mib_s']:,.1f} ({_ceiling_from(c, 'write')}, "
                                f"{span(*csp['write_mib_s'], ',.0f')}) / read "
                                f"{c['read_mib_s']:,.1f} MiB/s ({_ceiling_from(c, 'read')}, "
                                f"{span(*csp['read_mib_s'], ',.0f')}); efficiency save "
                                f"{pct.get('save_of_ceiling', '-')}, load {pct.get('load_of_ceiling', '-')}")))
    return rows


def _ceiling_from(c: dict, way: str) -> str:
    """Where a direction's ceiling came from: the direct probe (its shape), or the baseline where that was faster."""
    d, source = c["direct"], c[f"{way}_from"]
    shape = f"{d['request_bytes'] >> 20} MiB x {d['queue_depth']} a rank"
    if source == "baseline":
        return f"the baseline: the direct probe gave {d[f'{way}_mib_s']:,.0f}"
    if source == "buffered":
        return f"buffered, {shape}: O_DIRECT gave {d[f'{way}_mib_s']:,.0f}"
    return f"{'O_DIRECT' if d.get('o_direct') else 'buffered'}, {shape}"


# the words a newcomer would stop at, said once at the end where used (docs/measurements.md defines every figure)
TERMS = (
    ("blocking", ("the time training waited for a save; durable: until every file of it survives a crash (fsync, or "
                 "an upload complete)")),
    ("MAD", "median absolute deviation: how much the steps vary around their median step"),
    ("training lost", "wall time the saves cost training beyond its own steps (blocking, slowed steps, waits)"),
    ("storage delivered", "bytes the kernel read from the storage device for the ranks, not from the page cache"),
    ("major faults", "pages of mapped files (libraries) read from storage when first touched"),
    ("efficiency", "a save's durable throughput (a load's) over the storage baseline's write (read) throughput"),
    ("ceiling", ("the storage's best throughput in its probes: the baseline's, or a probe's at the ceiling's "
                "request size and queue depth (O_DIRECT, or for reads also buffered) where that was faster")),
    ("remainder", "a phase's seconds no cause names: samples of unnamed work, and time the sampler did not see"))


def _lost_rows(ck: views.CheckpointView) -> list[tuple[str, str]]:
    """What the saves cost training (results/training_cost.py): per save, against the run's own steps."""
    run = ck.training_lost or views.LostView()
    if not run.saves and not run.note:
        return []
    if run.per_save_seconds_median is None:
        return [("training lost", f"not measured: {run.note}")]
    base = run.baseline_step
    last = next(s for s in reversed(ck.saves) if (s.training_lost or {}).get("seconds") is not None)
    lost = last.training_lost
    noise = (f"; WITHIN NOISE (steps vary by +-{run.per_save_noise_seconds:.3f} s over a save's window): no "
             "measurable cost" if run.within_noise else "")
    return [("training lost", (f"per save median {_s(run.per_save_seconds_median)} over {count(run.saves, 'save')} "
                              f"against a {_s(base['seconds'])} step (median of {base['steps']} steps without a save "
                              f"in flight, MAD {_s(base['mad_seconds'])}){noise}")),
            (f"lost {last.tag}", (f"{_s(lost['seconds'])} = blocking {_s(lost['blocking_seconds'])} + "
                              f"{lost['overlapped_steps']} overlapped steps {lost['overlapped_extra_seconds']:+.3f} s + "
                              f"waits and other {lost['other_seconds']:+.3f} s")), *_harness_row(ck)]


def _harness_row(ck: views.CheckpointView) -> list[tuple[str, str]]:
    """The harness's own seconds beside the saves': its verification digest before each save (rank 0), which no
    figure above counts."""
    pairs = [(d, s.blocking_seconds) for s in ck.saves
             if (d := (s.training_lost or {}).get("digest_seconds")) and s.blocking_seconds]
    if not pairs:
        return []
    digest, blocking = sorted(d for d, _ in pairs)[len(pairs) // 2], sorted(b for _, b in pairs)[len(pairs) // 2]
    return [("harness's own", (f"verification digest before each save median {_s(digest)} ({digest / blocking:.1%} of "
                              f"the median blocking save {_s(blocking)}; rank 0), outside every figure above"))]


def _memory_rows(ck: views.CheckpointView, steps: dict | None, records) -> list[tuple[str, str]]:
    """What the saves cost in host memory (results/save_memory.py), and whether it grew save after save."""
    m = ck.memory
    if not m or not m.saves:
        return []

    def mib(x):
        return "-" if x is None else f"{x / MIB:+,.1f} MiB".replace("-0.0", "+0.0")

    buffers = m.engine_buffers_bytes_max
    rows = [("save memory", f"{mib(m.peak_added_bytes_max)} per rank at its peak over the RSS a save starts with "
                            f"(rank {m.peak_added_rank}, {m.peak_added_tag}); held while the flush runs "
                            f"{mib(m.held_bytes_max)}, retained at the commit {mib(m.retained_bytes_max)}"
                            + (f"; the engine keeps {buffers / MIB:,.1f} MiB of buffers between saves" if buffers
                               else "")),
            ("  beyond steps", (f"median {mib(m.cost_bytes_median)} a save over {m.saves} saves, less a "
                               f"training step's own {mib(m.step_peak_added_bytes)} where its flush overlapped steps"))]
    if ck.engine_staging:  # how the engine sized its host buffers (its own rows)
        rows += records.memory_rows(ck.engine_staging)
    g = m.growth or views.GrowthView()
    if g.bytes_per_save is None:
        rows.append(("memory growth", f"not measured: {g.note}"))
    else:
        verdict = "GROWING" if g.growing else "flat"
        se = g.standard_error_bytes
        rows.append(("memory growth", f"{verdict}: RSS at a save's start {mib(g.bytes_per_save)} per save"
                                      + (f" (standard error {se / MIB:,.1f} MiB)" if se is not None else "")
                                      + f" over saves 2-{g.saves}, rank {g.rank}; flagged from "
                                      f"{save_memory.GROWTH_FLOOR_BYTES / MIB:,.0f} MiB a save"
                                      + (f"; at a step's start {mib(steps['bytes_per_step'])} per step"
                                         if steps else "")
                                      + ("; training grows too: compare engine=none's training.rss_growth before "
                                         "blaming the engine" if g.growing and steps else "")))
    return rows


def _node_rows(name: str, nodes: list | None, worst: dict | None, seconds: str, nbytes: str,
               verb: str) -> list[tuple[str, str]]:
    """Per node, when the ranks ran on more than one (results/placement.py): its ranks, bytes and slowest rank's
    seconds, then the slowest node."""
    if len(nodes or []) < 2:
        return []
    parts = [f"{n['host']} {placement.ranks_text(n['ranks'])}: {_s(n[seconds])}"
             + (f", {n[nbytes] / MIB:,.2f} MiB {verb}" if n.get(nbytes) is not None else "") for n in nodes]
    tail = f"; slowest {worst['host']} (rank {worst['rank']})" if worst else ""
    return [(name, " | ".join(parts) + tail)]


def _restart_conditions(r: views.RestartView) -> str:
    """schema.restart_conditions as text: `prefork, cache drop, env_cache keep` (`, staged`)."""
    c = r.conditions()
    return ", ".join([c["launcher"] or "launcher -", f"cache {c['cache'] or '-'}",
                      *([f"env_cache {c['env_cache']}"] if c["env_cache"] else []), *(["staged"] if c["staged"] else [])])


def _restart_rows(restarts: tuple[views.RestartView, ...]) -> list[tuple[str, str]]:
    """Every restart of the checkpoint side by side (the point of repeating them: restart-only re-runs), with the
    median of those at the run's own layout that verified, one median a set of conditions (schema.restart_conditions):
    restarts that started otherwise are never pooled into one figure."""
    if len(restarts) < 2:
        return []
    rows, own = [], {}
    for r in restarts:
        timed = r.total_seconds is not None and r.launch_seconds is not None
        took = f"{_s(r.total_seconds)} + {_s(r.launch_seconds)} launcher" if timed else "-"
        verdict = "verified" if r.verified else "NOT verified" if r.verified is False else "failed"
        rows.append((f"  {r.record}", (f"{(r.layout or {}).get('loaded') or '-'} ({_restart_conditions(r)}), cache "
                                      f"{(r.cache or {}).get('observed', '-')}: {took}, {verdict}")))
        if r.verified and timed and r.at_own_layout():
            own.setdefault(_restart_conditions(r), []).append(r.total_seconds + r.launch_seconds)
    head = f"{len(restarts)} of this checkpoint"
    if own:
        medians = " | ".join(f"{_s(statistics.median(v))} over {len(v)} ({c})" for c, v in own.items())
        apart = "; not pooled: their launcher or cache settings differ" if len(own) > 1 else ""
        head += f"; at its own layout, verified, median with launcher: {medians}{apart}"
    return [("restarts", head), *rows]


def _prediction_rows(checked: views.PredictionView | None) -> list[tuple[str, str]]:
    """What the run predicted for itself before launch beside what it measured (docs/prediction.md)."""
    phases = (checked.phases if checked else None) or {}
    parts = []
    # the prediction is of the run's own first restart (results/prediction.py first_restart), whichever is shown above
    for label, name in (("durable save", "save_durable_seconds"), ("restart-01 with launcher", PREDICTED_TOTAL)):
        p = phases.get(name) or {}
        if p.get("predicted") is not None and p.get("measured") is not None:
            error = f"{p['rel_error']:+.0%}" if p.get("rel_error") is not None else \
                f"not compared: {p.get('not_comparable')}"
            parts.append(f"{label} {p['predicted']:.3f} s, measured {p['measured']:.3f} s ({error})")
    if not parts:
        return []
    busy = ("; MEASURED ON A BUSY MACHINE (other work before a launch: machine_load in summary.json), so the errors "
            "are not the model's" if checked.machine_busy else "")
    return [("predicted", f"{'; '.join(parts)}; calibration {checked.calibration['name']}{busy}"),
            *_crossover_rows(checked.crossover)]


def _crossover_rows(c: views.CrossoverView | None) -> list[tuple[str, str]]:
    """The checkpoint size from which the load is predicted the largest restart phase, and this run's side of it,
    predicted and measured (docs/prediction.md#the-crossover)."""
    if not c or not c.status:
        return []
    b, m = c.crossover_checkpoint_bytes, c.measured or {}
    text = (f"load the largest restart phase from {b / GIB:,.2f} GiB of checkpoint on (predicted)" if b else
            f"none predicted in range: {c.status.replace('_', ' ')}")
    if m.get("largest_phase") and m.get("checkpoint_bytes"):
        text += (f"; this run's {m['checkpoint_bytes'] / GIB:,.3f} GiB: largest phase predicted "
                 f"{_phase(c.run_largest_phase)}, measured {_phase(m['largest_phase'])}")
    return [("crossover", text)]


def _phase(name: str) -> str:
    return name.removeprefix("restart_").removesuffix("_seconds")
