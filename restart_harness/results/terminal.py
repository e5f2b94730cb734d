"""The one-screen summary printed at the end of a run."""

from __future__ import annotations

import statistics

from restart_harness import resolve
from restart_harness.results import placement, save_memory
from restart_harness.schema import (GIB, LOAD_CATEGORIES, MIB, PREDICTED_TOTAL, SAVE_CATEGORIES, count, io_metadata_ops,
                                    restart_conditions, span)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _ranks(n: int) -> str:
    return count(n, "rank")


def _when(base: dict) -> str:
    """Which measurement an efficiency is against: when it was taken, and whether this run took it."""
    age = base.get("age_seconds")
    if not base.get("cached"):
        return ", measured for this run"
    where = f" in {base['dir']} (the same file system)" if base.get("dir") else ""
    return f", cached, measured {age / 3600:.1f} h before the run{where}" if age is not None else f", cached{where}"


def _storage_rows(name: str, phase: dict) -> list[tuple[str, str]]:
    """What the object store's client went through in a phase, when something failed (requests retried, throttled,
    operations failed), and the multipart uploads a failed save left, aborted."""
    rows = []
    req = phase.get("storage_requests")
    if req and req["failed_requests"]:
        why = ", ".join(f"{n} {reason}" for reason, n in req["failures"].items())
        rows.append((name, f"{req['requests']} requests, {req['failed_requests']} failed ({why}): "
                           f"{req['throttled_requests']} throttled, {req['retried_requests']} retried by the client "
                           f"in operations that succeeded, {req['failed_operations']} operations failed"))
    uploads = phase.get("incomplete_uploads")
    if uploads and (uploads["aborted"] or uploads["error"]):
        rows.append(("uploads", f"{len(uploads['aborted'])} incomplete multipart uploads aborted"
                                + (f"; not all could be: {uploads['error']}" if uploads["error"] else "")))
    return rows


def render(summary: dict) -> str:
    spec, ck, rs = summary["spec"], summary["checkpoint"], summary["restart"]
    records = resolve.engine_class(spec["engine"]).records  # the engine's own rows
    restarts = summary.get("restarts") or []
    d = spec["derived"]
    shrunk = f" (shrunk /{spec['shrink']})" if d["shrunk"] else ""
    rows = [
        ("run", summary["run_id"]),
        ("model", f"{spec['model']}{shrunk}: {d['num_parameters'] / 1e6:,.2f} M parameters, {spec['precision']}, "
                  f"seq {spec['seq_len']}, global batch {d['global_batch']}"
                  + ("; EMULATED: no model, no training, the checkpoint's files written and read back"
                     if spec.get("emulate") else "")),
        ("layout", f"tp={spec['tp']} pp={spec['pp']} dp={spec['dp']} ({_ranks(d['world_size'])} on {spec['device']}), "
                   f"engine {spec['engine']}" + (f"; SUBSET: ranks 0-{d['launched_ranks'] - 1} ran, their files only"
                                                 if spec.get("subset") else "")),
        ("status", summary["status"]["state"] + (f": {summary['status']['reason']}" if summary["status"]["reason"] else "")),
    ]
    if summary["training"]["step_seconds_median"] is not None:
        rows.append(("train step", f"median {_s(summary['training']['step_seconds_median'])} "
                                   f"over {summary['training']['steps']} steps"))
    if summary["training"].get("steps_in_flight"):
        tr = summary["training"]
        rows.append(("overlap", f"median step {_s(tr['step_seconds_median_in_flight'])} with a flush in flight "
                                f"({tr['steps_in_flight']} steps), {_s(tr['step_seconds_median_no_flush'])} without"))
    if ck["files"]:
        kinds = ", ".join(f"{k} {v['files']}" for k, v in ck["by_kind"].items() if v["files"])
        rows.append(("checkpoint", f"{ck['tag']}: {ck['files']} files, {ck['bytes'] / MIB:,.2f} MiB ({kinds})"))
        if ck["bytes_per_rank"]:
            b = ck["bytes_per_rank"]
            rows.append(("per rank", f"max {b['max'] / MIB:,.2f} / min {b['min'] / MIB:,.2f} / "
                                     f"mean {b['mean'] / MIB:,.2f} MiB written"))
        for save in ck["saves"]:
            t = save["throughput_mib_s"]
            rows.append((f"save {save['tag']}",
                         f"blocking {_s(save['blocking_seconds'])} ({t['blocking'] or 0:,.1f} MiB/s), "
                         f"durable {_s(save['durable_seconds'])} ({t['durable'] or 0:,.1f} MiB/s)"
                         + (f", async: committed {_s(save['commit_seconds'])}" if save.get("async") else "")
                         + (f"; sha256 read back after the commit in {_s(save['checksum_seconds'])}"
                            if save.get("checksum_seconds") is not None else "")))
        rows += _lost_rows(ck)
        rows += _memory_rows(ck, (summary.get("training") or {}).get("rss_growth"), records)
        bd = (ck["saves"][-1] if ck["saves"] else {}).get("breakdown")
        if bd:
            parts = "  ".join(f"{c} {bd[f'{c}_seconds']:.3f}" if bd[f"{c}_seconds"] is not None else f"{c} -"
                              for c in SAVE_CATEGORIES)
            rows.append(("save anatomy", f"{parts}  (s, {ck['saves'][-1]['tag']}, slowest rank {bd['slowest_rank']})"))
        rows += _node_rows("save by node", (ck["saves"] or [{}])[-1], "durable_seconds", "bytes", "written")
    rows += _storage_rows("save requests", ck)
    if rs:
        c = rs["cache"] or {}
        layout, loaded = rs.get("layout") or {}, rs.get("loaded") or {}
        if layout and layout.get("loaded") != layout.get("saved"):
            read = (f": {loaded['files']} files, {loaded['bytes'] / MIB:,.2f} MiB" if loaded.get("files") else "")
            rows.append(("restarted at", f"{layout['loaded']} ({rs['ranks']} ranks), from {layout['saved']}; it loaded "
                                         f"{loaded.get('tag')}{read}"))
        until = "checkpoint loaded" if spec.get("emulate") else "first step done"
        latest = f" (latest of {len(restarts)})" if len(restarts) > 1 else ""
        env, staged = (rs.get("environment_cache") or {}).get("observed"), rs.get("staging")
        rows.append(("restart", f"{rs['record']}{latest}: {_s(rs['total_seconds'])} process start -> {until} "
                                f"(+{_s(rs['launch_seconds'])} launcher"
                                + (f", +{staged['seconds']:.3f} s staging the environment into "
                                   f"{staged['filesystem']['type']}" if staged else "")
                                + f"); cache {c.get('observed', '-')}" + (f", environment {env}" if env else "")))
        rows.append(("phases", "  ".join(f"{k} {v:.2f}" for k, v in rs["phases"].items())))
        rows += attribution_rows(rs.get("attribution"), rs["record"])
        rows += _io_rows(rs.get("io_sources"))
        sr = (rs.get("load_breakdown") or {}).get("storage_read")
        if rs.get("load_throughput_mib_s"):
            rows.append(("load", f"{_s(rs['load_seconds'])} waited for ({rs['load_throughput_mib_s']:,.1f} MiB/s)"
                                 + (f"; storage read {sr['throughput_mib_s']:,.1f} MiB/s ({sr['bytes'] / MIB:,.2f} MiB "
                                    f"read by all {count(rs['ranks'], 'rank')}, over the slowest one's "
                                    f"{sr['seconds']:.3f} s with a read in flight: rank {sr['slowest_rank']})"
                                    if sr else "")))
        rows += records.restart_rows(rs.get("engine_load_statistics") or {})
        lb = rs.get("load_breakdown")
        if lb:
            parts = "  ".join(f"{c} {lb[f'{c}_seconds']:.3f}" if lb[f"{c}_seconds"] is not None else f"{c} -"
                              for c in LOAD_CATEGORIES)
            rows.append(("load anatomy", f"{parts}  (s, slowest rank {lb['slowest_rank']})"))
        rows += _node_rows("restart by node", rs, "total_seconds", "read_bytes", "read")
        peak = max(((v["peak_rss_bytes_max"], k) for k, v in (rs.get("memory") or {}).items()), default=None)
        if peak:
            rows.append(("memory", f"restart peak RSS {peak[0] / MIB:,.0f} MiB per rank, in {peak[1]}"))
        rows += _storage_rows("load requests", rs)
        verdict = "yes" if rs["verified"] else "NO: " + ", ".join(rs["differing"][:3])
        integrity = rs.get("integrity")
        rows.append(("verified", f"{verdict} ({_ranks(rs['ranks'])}, {rs['verified_tensors']} tensors)"
                                 + (f"; before the launch {integrity['files']} files matched their "
                                    f"{integrity['algorithm']} from the commit" if integrity else "")))
    base, eff = summary.get("baseline") or {}, ck.get("efficiency") or {}
    if base.get("write_mib_s"):
        pct = {k: "-" if v is None else f"{v:.0%}" for k, v in eff.items()}
        sp = base.get("spread")
        spread = (f"; over {sp['repeats']} probes write {span(*sp['write_mib_s'], ',.0f')}, read "
                  f"{span(*sp['read_mib_s'], ',.0f')}" if sp else "; one probe, no spread")
        rows.append(("storage", f"baseline write {base['write_mib_s']:,.1f} / read {base['read_mib_s']:,.1f} MiB/s "
                                f"({base['method']}{_when(base)}{spread}); efficiency save "
                                f"{pct.get('save', '-')}, load {pct.get('load', '-')}"))
        c = base.get("ceiling")
        if c:
            csp = c["spread"]
            rows.append(("ceiling", f"write {c['write_mib_s']:,.1f} ({_ceiling_from(c, 'write')}, "
                                    f"{span(*csp['write_mib_s'], ',.0f')}) / read "
                                    f"{c['read_mib_s']:,.1f} MiB/s ({_ceiling_from(c, 'read')}, "
                                    f"{span(*csp['read_mib_s'], ',.0f')}); efficiency save "
                                    f"{pct.get('save_of_ceiling', '-')}, load {pct.get('load_of_ceiling', '-')}"))
    rows += _restart_rows(restarts)
    rows += _prediction_rows(summary.get("prediction"))
    rows += _terms(" ".join(f"{k} {v}" for k, v in rows))  # a row's name may be the term (ceiling)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _ceiling_from(c: dict, way: str) -> str:
    """Where a direction's ceiling came from: the direct probe (its shape), or the baseline where that was faster."""
    d = c["direct"]
    shape = f"{d['request_bytes'] >> 20} MiB x {d['queue_depth']} a rank"
    if c[f"{way}_from"] == "baseline":
        return f"the baseline: the direct probe gave {d[f'{way}_mib_s']:,.0f}"
    if c[f"{way}_from"] == "buffered":
        return f"buffered, {shape}: O_DIRECT gave {d[f'{way}_mib_s']:,.0f}"
    io = "O_DIRECT" if d.get("o_direct") else "buffered"
    return f"{io}, {shape}"


# the words of this summary a newcomer would stop at, each said once at its end where the summary used it
# (docs/measurements.md defines every figure)
TERMS = (
    ("blocking", "the time training waited for a save; durable: until every file of it survives a crash (fsync, or "
                 "an upload complete)"),
    ("MAD", "median absolute deviation: how much the steps vary around their median step"),
    ("training lost", "wall time the saves cost training beyond its own steps (blocking, slowed steps, waits)"),
    ("storage delivered", "bytes the kernel read from the storage device for the ranks, not from the page cache"),
    ("major faults", "pages of mapped files (libraries) read from storage when first touched"),
    ("efficiency", "a save's durable throughput (a load's) over the storage baseline's write (read) throughput"),
    ("ceiling", "the storage's best throughput in its probes: the baseline's, or a probe's at the ceiling's "
                "request size and queue depth (O_DIRECT, or for reads also buffered) where that was faster"),
    ("remainder", "a phase's seconds no cause names: samples of unnamed work, and time the sampler did not see"),
)


def attribution_rows(att: dict | None, record: str) -> list[tuple[str, str]]:
    """"where the restart went": each phase's largest causes (results/attribution.py), its slowest rank's."""
    title = "where the restart went"
    if not att:
        return []
    if not att.get("sampled"):
        return [(title, f"not sampled (attribution={att['mode']}): {att['reason']}; phase timings only")]
    rows = [(title, f"each phase's causes on its slowest rank, s ({att['tool']}, {att['rate_hz']} Hz samples; "
                    f"flame graphs in profiles/{record}/)")]
    for phase, p in att["phases"].items():
        if not p["seconds"]:
            continue
        shown = [c for c in p["causes"] if c["seconds"] >= 0.05 * p["seconds"]][:3] or p["causes"][:1]
        rest = sum(c["seconds"] for c in p["causes"]) - sum(c["seconds"] for c in shown)
        parts = [f"{c['cause']} {c['seconds']:.2f}" + (_detail(c) if i == 0 else "") for i, c in enumerate(shown)]
        if rest >= 0.005:
            parts.append(f"{len(p['causes']) - len(shown)} more {rest:.2f}")
        parts.append(f"remainder {p['remainder_seconds']:.2f}")
        if p.get("reads"):
            f = p["reads"][0]
            parts.append(f"longest read {f['file']} {f['read_seconds']:.3f} s ({f['read_bytes'] / 2**20:,.2f} MiB)")
        rows.append((f"  {phase}", f"{p['seconds']:.2f}: " + ", ".join(parts)))
    return rows


def _detail(cause: dict) -> str:
    """An import's largest packages and who imported it."""
    said = [f"{k} {v:.2f}" for k, v in list((cause.get("parts") or {}).items())[:2]]
    if cause.get("via"):
        said.append(f"by {cause['via']}")
    return f" ({'; '.join(said)})" if said else ""


def _terms(text: str) -> list[tuple[str, str]]:
    used = [(word, meaning) for word, meaning in TERMS if word in text]
    return [("terms" if i == 0 else "", f"{word}: {meaning}") for i, (word, meaning) in enumerate(used)]


def _lost_rows(ck: dict) -> list[tuple[str, str]]:
    """What the saves cost training (results/training_cost.py): per save, against the run's own steps."""
    run = ck.get("training_lost") or {}
    if not run.get("saves") and not run.get("note"):
        return []
    if run.get("per_save_seconds_median") is None:
        return [("training lost", f"not measured: {run.get('note')}")]
    base = run["baseline_step"]
    last = next(s for s in reversed(ck["saves"]) if (s.get("training_lost") or {}).get("seconds") is not None)
    lost = last["training_lost"]
    noise = (f"; WITHIN NOISE (steps vary by +-{run['per_save_noise_seconds']:.3f} s over a save's window): no "
             "measurable cost" if run.get("within_noise") else "")
    return [("training lost", f"per save median {_s(run['per_save_seconds_median'])} over {count(run['saves'], 'save')} "
                              f"against a {_s(base['seconds'])} step (median of {base['steps']} steps without a save "
                              f"in flight, MAD {_s(base['mad_seconds'])}){noise}"),
            (f"lost {last['tag']}", f"{_s(lost['seconds'])} = blocking {_s(lost['blocking_seconds'])} + "
                              f"{lost['overlapped_steps']} overlapped steps {lost['overlapped_extra_seconds']:+.3f} s + "
                              f"waits and other {lost['other_seconds']:+.3f} s")]


def _memory_rows(ck: dict, steps: dict | None, records) -> list[tuple[str, str]]:
    """What the saves cost in host memory (results/save_memory.py), and whether it grew save after save."""
    m = ck.get("memory")
    if not m or not m.get("saves"):
        return []

    def mib(x):
        return "-" if x is None else f"{x / MIB:+,.1f} MiB".replace("-0.0", "+0.0")

    buffers = m.get("engine_buffers_bytes_max")
    rows = [("save memory", f"{mib(m['peak_added_bytes_max'])} per rank at its peak over the RSS a save starts with "
                            f"(rank {m['peak_added_rank']}, {m['peak_added_tag']}); held while the flush runs "
                            f"{mib(m['held_bytes_max'])}, retained at the commit {mib(m['retained_bytes_max'])}"
                            + (f"; the engine keeps {buffers / MIB:,.1f} MiB of buffers between saves" if buffers
                               else "")),
            ("  beyond steps", f"median {mib(m['cost_bytes_median'])} a save over {m['saves']} saves, less a "
                               f"training step's own {mib(m['step_peak_added_bytes'])} where its flush overlapped steps")]
    if ck.get("engine_staging"):  # how the engine sized its host buffers (its own rows)
        rows += records.memory_rows(ck["engine_staging"])
    g = m["growth"]
    if g.get("bytes_per_save") is None:
        rows.append(("memory growth", f"not measured: {g['note']}"))
    else:
        verdict = "GROWING" if g["growing"] else "flat"
        se = g["standard_error_bytes"]
        rows.append(("memory growth", f"{verdict}: RSS at a save's start {mib(g['bytes_per_save'])} per save"
                                      + (f" (standard error {se / MIB:,.1f} MiB)" if se is not None else "")
                                      + f" over saves 2-{g['saves']}, rank {g['rank']}; flagged from "
                                      f"{save_memory.GROWTH_FLOOR_BYTES / MIB:,.0f} MiB a save"
                                      + (f"; at a step's start {mib(steps['bytes_per_step'])} per step"
                                         if steps else "")
                                      + ("; training grows too: compare engine=none's training.rss_growth before "
                                         "blaming the engine" if g["growing"] and steps else "")))
    return rows


def _io_rows(io: dict | None) -> list[tuple[str, str]]:
    """The restart's I/O besides the checkpoint's, per rank (results/io_sources.py), and where imports' comes from."""
    if not io or not io.get("ranks"):
        return []
    n, total, kernel = io["ranks"], io["total"]["sources"], io["total"].get("kernel") or {}
    delivered = (f"storage delivered {kernel['storage_read_bytes'] / n / MIB:,.1f} MiB, "
                 f"{kernel.get('major_faults', 0) / n:,.0f} major faults" if "storage_read_bytes" in kernel else "")
    if not io.get("by_source", True):
        return [("restart I/O", f"per rank {delivered or 'not measured'}; by source not counted (anatomy=false)")]
    rest = [c for name, c in total.items() if name != "checkpoint"]
    libraries = [c for name, c in total.items() if name not in ("checkpoint", "pseudo")]  # not /dev/shm segments
    ops = sum(io_metadata_ops(c) for c in rest) / n
    read = sum(c.get("read_bytes", 0) for c in rest) / n
    mapped = sum(c.get("mapped_bytes", 0) for c in libraries) / n
    ckpt = total.get("checkpoint", {})
    text = (f"per rank {ops:,.0f} metadata ops ({sum(c.get('opens', 0) for c in rest) / n:,.0f} opens), "
            f"{read / MIB:,.1f} MiB read and {mapped / MIB:,.0f} MiB of libraries mapped besides the checkpoint's "
            f"{io_metadata_ops(ckpt) / n:,.0f} ops and {ckpt.get('read_bytes', 0) / n / MIB:,.2f} MiB")
    imports = (io["phases"].get("imports") or {}).get("sources") or {}
    if imports:
        ops_by = {name: io_metadata_ops(c) for name, c in imports.items()}
        top = max(ops_by, key=ops_by.get)
        fs = io.get("filesystems", {}).get(top)
        text += (f"; imports {sum(ops_by.values()) / n:,.0f} ops, {ops_by[top] / max(1, sum(ops_by.values())):.0%} "
                 f"in {top}" + (f" ({fs})" if fs else ""))
    return [("restart I/O", text + (f"; {delivered}" if delivered else ""))]


def _node_rows(name: str, phase: dict, seconds: str, nbytes: str, verb: str) -> list[tuple[str, str]]:
    """Per node, when the ranks ran on more than one (results/placement.py): its ranks, bytes and slowest rank's
    seconds, then the slowest node."""
    nodes, worst = phase.get("per_node") or [], phase.get("slowest_node")
    if len(nodes) < 2:
        return []
    parts = [f"{n['host']} {placement.ranks_text(n['ranks'])}: {_s(n[seconds])}"
             + (f", {n[nbytes] / MIB:,.2f} MiB {verb}" if n.get(nbytes) is not None else "") for n in nodes]
    tail = f"; slowest {worst['host']} (rank {worst['rank']})" if worst else ""
    return [(name, " | ".join(parts) + tail)]


def _restart_conditions(r: dict) -> str:
    """schema.restart_conditions as text: `prefork, cache drop, env_cache keep` (`, staged`)."""
    c = restart_conditions(r)
    return ", ".join([c["launcher"] or "launcher -", f"cache {c['cache'] or '-'}",
                      *([f"env_cache {c['env_cache']}"] if c["env_cache"] else []), *(["staged"] if c["staged"] else [])])


def _restart_rows(restarts: list[dict]) -> list[tuple[str, str]]:
    """Every restart of the checkpoint side by side (the point of repeating them: restart-only re-runs), with the
    median of those at the run's own layout that verified, one median a set of conditions (schema.restart_conditions):
    restarts that started otherwise are never pooled into one figure."""
    if len(restarts) < 2:
        return []
    rows = []
    for r in restarts:
        layout = (r.get("layout") or {}).get("loaded") or "-"
        took = (f"{_s(r['total_seconds'])} + {_s(r['launch_seconds'])} launcher"
                if r.get("total_seconds") is not None and r.get("launch_seconds") is not None else "-")
        verdict = "verified" if r.get("verified") else "NOT verified" if r.get("verified") is False else "failed"
        rows.append((f"  {r['record']}", f"{layout} ({_restart_conditions(r)}), cache "
                                         f"{(r.get('cache') or {}).get('observed', '-')}: {took}, {verdict}"))
    own: dict[str, list[float]] = {}
    for r in restarts:
        if (r.get("verified") and r.get("total_seconds") is not None and r.get("launch_seconds") is not None
                and (r.get("layout") or {}).get("loaded") == (r.get("layout") or {}).get("saved")):
            own.setdefault(_restart_conditions(r), []).append(r["total_seconds"] + r["launch_seconds"])
    if own:
        medians = " | ".join(f"{_s(statistics.median(v))} over {len(v)} ({c})" for c, v in own.items())
        apart = "; not pooled: their launcher or cache settings differ" if len(own) > 1 else ""
        rows.insert(0, ("restarts", f"{len(restarts)} of this checkpoint; at its own layout, verified, median with "
                                    f"launcher: {medians}{apart}"))
    else:
        rows.insert(0, ("restarts", f"{len(restarts)} of this checkpoint"))
    return rows


def _prediction_rows(checked: dict | None) -> list[tuple[str, str]]:
    """What the run predicted for itself before launch beside what it measured (docs/prediction.md)."""
    phases = (checked or {}).get("phases") or {}
    parts = []
    # the prediction is of the run's own first restart (results/prediction.py first_restart), whichever is shown above
    for label, name in (("durable save", "save_durable_seconds"), ("restart-01 with launcher", PREDICTED_TOTAL)):
        p = phases.get(name) or {}
        if p.get("predicted") is not None and p.get("measured") is not None:
            parts.append(f"{label} {p['predicted']:.3f} s, measured {p['measured']:.3f} s ({p['rel_error']:+.0%})")
    if not parts:
        return []
    busy = ("; MEASURED ON A BUSY MACHINE (other work before a launch: machine_load in summary.json), so the errors "
            "are not the model's" if checked.get("machine_busy") else "")
    return [("predicted", f"{'; '.join(parts)}; calibration {checked['calibration']['name']}{busy}"),
            *_crossover_rows(checked.get("crossover"))]


def _crossover_rows(c: dict | None) -> list[tuple[str, str]]:
    """The checkpoint size from which the load is predicted the largest restart phase, and this run's side of it,
    predicted and measured (docs/prediction.md#the-crossover)."""
    if not c or not c.get("status"):
        return []
    b, m = c.get("crossover_checkpoint_bytes"), c.get("measured") or {}
    text = (f"load the largest restart phase from {b / GIB:,.2f} GiB of checkpoint on (predicted)" if b else
            f"none predicted in range: {c['status'].replace('_', ' ')}")
    if m.get("largest_phase") and m.get("checkpoint_bytes"):
        text += (f"; this run's {m['checkpoint_bytes'] / GIB:,.3f} GiB: largest phase predicted "
                 f"{_phase(c['run_largest_phase'])}, measured {_phase(m['largest_phase'])}")
    return [("crossover", text)]


def _phase(name: str) -> str:
    return name.removeprefix("restart_").removesuffix("_seconds")
