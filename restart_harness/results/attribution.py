"""Where each phase's seconds went (attribution=): the sampler's trace (results/samples.py) cut at the ranks' marks, each
sample named by its cause (results/causes.py), into summary.json's `attribution`, flame graphs and the terminal's rows.
The method: docs/attribution.md#what-it-does."""

from __future__ import annotations

import functools
import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path

from restart_harness.files.atomic import write_text_atomic
from restart_harness.results import causes, samples
from restart_harness.results import events as ev
from restart_harness.schema import ANCHOR_PREFIX, ANCHOR_SAMPLES, ATTRIBUTION_RATE_HZ

LAUNCHER = "launcher"  # the phase before any rank starts: the launch script, the launcher's processes
REMAINDER_SHOWN = 5  # the largest unnamed causes listed in a phase's remainder
PARTS_SHOWN = 5  # an import's largest packages
CARRIED_INTERVALS = 2  # a sample taken before a phase began speaks for it at most this many sampling intervals on


def _round(x: float) -> float:
    return round(x, 6)


def of_record(run_dir: Path, record: str, events: dict[int, list[dict]], phases, launch: dict) -> dict | None:
    """summary.json's `attribution` of one launch record: None where it was not asked; where it was asked and could
    not sample, why. `phases`: (name, start mark, end mark) of the record's phases."""
    asked = launch.get("attribution")
    if not asked:
        return None
    if not asked.get("sampled"):
        return asked
    trace_path = run_dir / asked["trace"] if asked.get("trace") else None
    if trace_path is None or not trace_path.is_file():
        return {**asked, "sampled": False, "reason": "the sampler wrote no trace (its launch was killed, or failed "
                                                     "before the sampler wrote it)"}
    trace = samples.read(trace_path)
    estimates, ranks = [], {}
    for rank, evs in sorted(events.items()):
        process = next((e for e in evs if e["event"] == "process"), None)
        thread = trace.of_pid(process["pid"], process.get("thread")) if process else None
        if thread is not None:
            ranks[rank] = (thread, evs)
            estimates += _offsets(trace, thread, [e for e in evs if e["event"] == "anchor"])
    if not ranks:
        return {**asked, "sampled": False, "reason": "no rank's process is in the sampler's trace"}
    # the ranks of a launch share one node's clock and the one sampler's: one offset, from every anchor found
    if estimates:
        clock = {"source": "anchors", "estimates": len(estimates),
                 "spread_seconds": _round(max(estimates) - min(estimates))}
        shared = statistics.median(estimates)
    else:  # no sample fell inside a pause (a sampler lagging far behind): its clock starts with the launch
        clock = {"source": "launch start", "estimates": 0, "spread_seconds": None}
        shared = launch["start"]
    carry, folder = CARRIED_INTERVALS / (asked.get("rate_hz") or ATTRIBUTION_RATE_HZ), trace_path.parent
    per_rank: dict[int, dict] = {}
    for rank, (thread, evs) in ranks.items():
        marks, spans = ev.marks(evs), _with_parent(trace, thread)
        verify = next((e["seconds"] for e in evs if e["event"] == "verify"), 0.0)
        per_rank[rank] = {name: _phase(trace, _clip(spans, marks[a] - shared, marks[b] - shared, carry),
                                       marks[b] - marks[a] - (verify if name == "first_step" else 0.0),
                                       folder / f"rank-{rank:05d}" / f"{name}.speedscope.json", run_dir)
                          for name, a, b in phases if a in marks and b in marks}
    launcher = _launcher_phase(trace, ranks, events, launch, shared, folder, run_dir)
    out_phases = {LAUNCHER: launcher} if launcher is not None else {}
    for name, _, _ in phases:
        have = {rank: p[name] for rank, p in per_rank.items() if name in p}
        if have:
            slowest = max(have, key=lambda r: have[r]["seconds"])
            out_phases[name] = {"rank": slowest, **have[slowest]}
    return {**asked, "clock": clock, "ranks_sampled": sorted(ranks),
            "ranks_not_sampled": sorted(set(events) - set(ranks)), "phases": out_phases,
            "per_rank": {rank: p for rank, p in sorted(per_rank.items())}}


def _with_parent(trace: samples.Trace, thread: samples.Thread):
    """A rank's spans, preceded by its parent process's before the rank's first sample: a rank forked from a process
    that imported for it (launcher=prefork) counts from that process's start, and its imports are the parent's."""
    chain = _chain(trace, thread)
    parent = trace.of_pid(chain[-2]) if len(chain) >= 2 and chain[-1] == thread.pid else None
    return thread.spans if parent is None else [s for s in parent.spans if s[1] <= thread.first] + thread.spans


# the load anatomy's categories (restart_harness/worker/anatomy.py, docs/anatomy.md) as causes of checkpoint_load
LOAD_CAUSES = {
    "read": ("checkpoint", "reading the checkpoint's files (I/O calls)"),
    "deserialize": ("checkpoint", "deserialization (the engine's load, reads inside it excluded)"),
    "copy": ("checkpoint", "copies into the model and the optimizer"),
    "wait": ("collective", "waiting for the other ranks (collectives inside the load)"),
    "other": ("other", "the load's other work (the engine's Python between those calls)")}


def with_load_anatomy(att: dict | None, load_breakdown: dict | None) -> None:
    """checkpoint_load's causes from its anatomy, where it has one: the load is timed call by call (reads by the I/O
    counters, the engine's load, copies, collectives), which a phase of a few samples cannot resolve; the samples'
    own causes stay beside them (`sampled_causes`), and the files the rank read longest are `reads`."""
    phase = ((att or {}).get("phases") or {}).get("checkpoint_load")
    if not phase or not load_breakdown:
        return
    row = next((r for r in load_breakdown.get("per_rank") or [] if r["rank"] == phase["rank"]), None)
    if row is None or any(row.get(f"{c}_seconds") is None for c in LOAD_CAUSES):
        return
    measured = {c: row[f"{c}_seconds"] for c in LOAD_CAUSES}
    scale = phase["seconds"] / sum(measured.values()) if sum(measured.values()) > phase["seconds"] > 0 else 1.0
    phase["sampled_causes"] = phase["causes"]
    phase["causes"] = sorted(({"kind": LOAD_CAUSES[c][0], "cause": LOAD_CAUSES[c][1], "seconds": _round(t * scale)}
                              for c, t in measured.items() if t > 0), key=lambda c: -c["seconds"])
    phase["remainder_seconds"] = _round(max(phase["seconds"] - sum(c["seconds"] for c in phase["causes"]), 0.0))
    phase["remainder"] = {"unsampled_seconds": 0.0, "unnamed": [], "outside_the_anatomy_seconds":
                          phase["remainder_seconds"]}
    phase["method"] = "anatomy"
    mine = sorted((f for f in load_breakdown.get("files") or []
                   if f["rank"] == phase["rank"] and f.get("read_seconds")), key=lambda f: -f["read_seconds"])
    phase["reads"] = [{"file": f["path"], "read_seconds": f["read_seconds"], "read_bytes": f["read_bytes"]}
                      for f in mine[:REMAINDER_SHOWN]]


def _offsets(trace: samples.Trace, thread: samples.Thread, anchors: list[dict]) -> list[float]:
    """Estimates of (rank's wall clock - sampler's clock) from the anchors: the first sample inside a pause comes
    within one interval after its start, the first one after it within one interval after its end."""
    out = []
    for anchor in anchors:
        name = ANCHOR_PREFIX + anchor["mark"]
        inside = [i for i, (_, _, stack) in enumerate(thread.spans) if any(trace.frames[f].name == name
                                                                             for f in stack)]
        if inside:
            interval = (anchor["end"] - anchor["start"]) / ANCHOR_SAMPLES
            out.append(anchor["start"] - thread.spans[inside[0]][0] + interval / 2)
            if inside[-1] + 1 < len(thread.spans):  # a thread's last stretch ends when the sampler stopped
                out.append(anchor["end"] - thread.spans[inside[-1]][1] + interval / 2)
    return out


def _clip(spans, lo: float, hi: float, carry: float | None = None):
    """The stretches inside [lo, hi]; with carry, one that began before lo counts in it only until carry seconds after
    its sample (a sampler lagging on a busy machine stretched the checkpoint load's last sample into first_step)."""
    out = []
    for s, e, stack in spans:
        end = min(e, hi, s + carry) if carry is not None and s < lo else min(e, hi)
        if end > max(s, lo):
            out.append((max(s, lo), end, stack))
    return out


def _phase(trace: samples.Trace, spans, seconds: float, flame: Path | None, run_dir: Path,
           launcher: bool = False, known: dict | None = None) -> dict:
    """`known`: cause -> seconds of time no sample covers but whose cause is known."""
    named: dict[causes.Cause, float] = defaultdict(float, known or {})
    via: dict[causes.Cause, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    parts: dict[causes.Cause, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    kept = []
    name = functools.cache(lambda stack: causes.classify([trace.frames[f] for f in stack], launcher))
    for s, e, stack in spans:
        cause = name(stack)
        if cause.kind == causes.EXCLUDED:
            continue
        named[cause] += e - s
        if cause.via:
            via[cause][cause.via] += e - s
        if cause.part:
            parts[cause][cause.part] += e - s
        kept.append((s, e, stack))
    sampled = sum(t for c, t in named.items() if c not in (known or {}))
    unsampled = max(seconds - sampled - sum((known or {}).values()), 0.0)
    listed = sorted(((c, t) for c, t in named.items() if c.kind != "remainder"), key=lambda x: -x[1])
    unnamed = sorted(((c, t) for c, t in named.items() if c.kind == "remainder"), key=lambda x: -x[1])
    # the samples may cover a little more than the marks (the clocks agree within an interval): scaled to the phase
    covered = sum(named.values())
    scale = seconds / covered if covered > seconds > 0 else 1.0
    remainder = sum(t for _, t in unnamed) * scale + unsampled
    out = {
        "seconds": _round(seconds),
        "sampled_seconds": _round(sampled),
        "causes": [{"kind": c.kind, "cause": c.name, "seconds": _round(t * scale),
                    **({"via": max(via[c].items(), key=lambda x: x[1])[0]} if via.get(c) else {}),
                    **({"parts": {k: _round(v * scale) for k, v in sorted(parts[c].items(), key=lambda x: -x[1])
                                  [:PARTS_SHOWN]}} if parts.get(c) else {})}
                   for c, t in listed],
        "remainder_seconds": _round(remainder),
        "remainder": {"unsampled_seconds": _round(unsampled),
                      "unnamed": [{"cause": c.name, "seconds": _round(t * scale)}
                                  for c, t in unnamed[:REMAINDER_SHOWN]]}}
    if flame is not None and kept:
        flame.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(flame, json.dumps(speedscope(trace, kept, f"{flame.parent.name} {flame.name.split('.')[0]}"),
                                            separators=(",", ":")))
        out["flame_graph"] = str(flame.relative_to(run_dir))
    return out


def _launcher_phase(trace, ranks, events, launch, offset: float, folder: Path, run_dir: Path) -> dict | None:
    """From the launch's start to the last rank's process start: the launcher processes' samples (those of no rank
    and of no rank's child), one at a time: the latest started that is not waiting on a child."""
    starts = [ev.marks(evs).get("process_start") for evs in events.values()]
    if not launch.get("start") or not starts or None in starts:
        return None
    lo, hi = launch["start"] - offset, max(starts) - offset
    rank_pids = {thread.pid for thread, _ in ranks.values()}
    threads = sorted((t for t in trace.threads.values() if t.pid not in rank_pids and t.spans
                      and trace.of_pid(t.pid) is t and not set(_chain(trace, t)) & rank_pids),
                     key=lambda t: -t.first)  # the latest started first
    cause = functools.cache(lambda stack: causes.classify([trace.frames[f] for f in stack], launcher=True))
    clipped = [_clip(t.spans, lo, hi) for t in threads]
    edges = sorted({x for spans in clipped for s, e, _ in spans for x in (s, e)})
    chosen, cursor = [], [0] * len(clipped)
    for a, b in itertools.pairwise(edges):
        best = None
        for i, spans in enumerate(clipped):
            while cursor[i] < len(spans) and spans[cursor[i]][1] <= a:
                cursor[i] += 1
            if cursor[i] < len(spans) and spans[cursor[i]][0] <= a:
                stack = spans[cursor[i]][2]
                if best is None:
                    best = stack
                if cause(stack).name != "waiting on its child processes":
                    best = stack
                    break
        if best is not None:
            chosen.append((a, b, best))
    # before the sampler's first sample: the launch script's shell, and the sampler starting (it starts the launch)
    lead = max(min(chosen[0][0] if chosen else hi, hi) - lo, 0.0)
    return {"rank": None, **_phase(trace, chosen, hi - lo, folder / "launcher.speedscope.json", run_dir, True,
                                   {causes.BEFORE_SAMPLING: lead} if lead else None)}


def _chain(trace: samples.Trace, thread: samples.Thread) -> list[int]:
    """The pids py-spy names above a thread's first sample (its `process PID: command` frames), outermost first."""
    names = [trace.frames[f].name for f in thread.spans[0][2]] if thread.spans else []
    return [int(p) for p in (n[len("process "):].split(":", 1)[0] for n in names if n.startswith("process "))
            if p.isdigit()]


def speedscope(trace: samples.Trace, spans, name: str) -> dict:
    """speedscope's file format (https://github.com/jlfwong/speedscope/wiki/Importing-from-custom-sources): one
    sampled profile, a sample per stretch of one stack weighted by its seconds, in time order."""
    index: dict[int, int] = {}
    frames, stacks, weights = [], [], []
    for s, e, stack in spans:
        row = []
        for f in stack:
            if f not in index:
                index[f] = len(frames)
                fr = trace.frames[f]
                frames.append({"name": fr.name, **({"file": causes.relative(fr.file), "line": fr.line}
                                                   if fr.file else {})})
            row.append(index[f])
        stacks.append(row)
        weights.append(_round(e - s))
    return {"$schema": "https://www.speedscope.app/file-format-schema.json", "exporter": "restart-harness",
            "name": name, "activeProfileIndex": 0, "shared": {"frames": frames},
            "profiles": [{"type": "sampled", "name": name, "unit": "seconds", "startValue": 0,
                          "endValue": _round(sum(weights)), "samples": stacks, "weights": weights}]}


def attribution_rows(att: dict | None, record: str) -> list[tuple[str, str]]:
    """"where the restart went": each phase's largest causes (results/attribution.py), its slowest rank's."""
    title = "where the restart went"
    if not att:
        return []
    if not att.get("sampled"):
        return [(title, f"not sampled (attribution={att['mode']}): {att['reason']}; phase timings only")]
    rows = [(title, (f"each phase's causes on its slowest rank, s ({att['tool']}, {att['rate_hz']} Hz samples; "
                    f"flame graphs in profiles/{record}/)"))]
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
