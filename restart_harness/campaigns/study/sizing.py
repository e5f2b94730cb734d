"""What each cell can be here, and which: the options (a real run, emulation at real size, shrunk, predicted), each
checked as a run would be and estimated from the calibration; the priority of the cells and the share of the time
each may take (docs/study.md#sized-before-it-starts)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from restart_harness import machine, preflight, resolve
from restart_harness.campaigns.study.cells import Cell, Option, plan_record
from restart_harness.campaigns.sweep import clock
from restart_harness.command.parse import StudyRequest, parse_run
from restart_harness.errors import UsageError
from restart_harness.files import baseline
from restart_harness.files.fsfacts import filesystem, nearest_existing
from restart_harness.phases import say
from restart_harness.plan import estimate
from restart_harness.plan.estimate import size_text
from restart_harness.predict import features as feats
from restart_harness.predict import fit, forecast
from restart_harness.predict import model as prediction_model
from restart_harness.schema import GIB

SHRINKS = (2, 4, 8, 16, 32, 64)  # 64: the largest that keeps every preset's head dimension even and tp dividing FFN
# A run spends a few seconds outside its two launches (harness start, the page-cache step, finalize).
HARNESS_SECONDS = 8.0
# An emulated cell's file state in memory at once, of the memory available when it is sized (a lone run takes 60%):
# on a shared 2-core machine 8-rank 13B cells lost ranks to the OOM killer at 60% and at 40% while other work grew
STUDY_EMULATE_MEMORY_FRACTION = 0.25
REASONS = " | "  # between the reasons of the options not taken (a reason itself may hold "; ")


# ---- storage, predictions, options -------------------------------------------------------------------------------
ASSUMED_BANDWIDTH_MIB_S = 200.0  # for sizing only, where no baseline is cached yet (measured before the first run)


def storage(request: StudyRequest, cells: list[Cell], measure: bool) -> dict:
    """The storage every prediction assumes (forecast.storage): bandwidths stated (write_gbps=, read_gbps=), else the
    baseline of where the checkpoints go: cached, or measured now (measure=True), or, for sizing before anything is
    created, an assumed one that says so."""
    p = request.predict
    plugins = resolve.plugins(cells[0].spec)
    extra = {"metadata_ops_s": p.metadata_ops_s, "env_metadata_ops_s": p.env_metadata_ops_s}
    if p.write_gbps is not None:
        return {**forecast.storage(plugins, p.write_gbps, p.read_gbps, **extra),
                "label": f"stated: write {p.write_gbps:g} GB/s, read {p.read_gbps:g} GB/s (aggregate)"}
    probe = plugins.target.storage_probe()
    spec = cells[0].spec
    record = baseline.cached(probe)
    stale = record is None or (baseline.age_seconds(record) or float("inf")) > spec.baseline_max_age_hours * 3600
    if measure and stale:
        say(f"[study] measuring the storage baseline of {probe.describe()} (the predictions' bandwidth)")
        record = baseline.for_run(probe, 64 << 20, min(os.cpu_count() or 1, baseline.AUTO_MAX_RANKS),
                                  spec.baseline_max_age_hours * 3600)
        if record.get("error"):
            record = None
    if record is None:
        assumed = ASSUMED_BANDWIDTH_MIB_S * (1 << 20)
        return {"write_bytes_per_s": assumed, "read_bytes_per_s": assumed, "assumed": True,
                "source": f"assumed {ASSUMED_BANDWIDTH_MIB_S:g} MiB/s for sizing (no baseline of {probe.describe()} "
                          "yet; measured before the first run)", "label": f"assumed {ASSUMED_BANDWIDTH_MIB_S:g} MiB/s"}
    fs = filesystem(nearest_existing(Path(estimate.checkpoint_dir(spec))))
    return {**forecast.storage(plugins, record=record, **extra),
            "label": (f"{fs['type'] or '?'} at {fs['mount']}: baseline write {record['write_mib_s']:,.0f} / read "
                      f"{record['read_mib_s']:,.0f} MiB/s ({record.get('method')}, "
                      f"{str(record.get('measured_at'))[:16]})")}


def predict_cells(cells: list[Cell], store: dict, target: dict) -> None:
    """Each cell's planned files and its predicted phases at real size, for the target (campaign.target_of: its
    device, and CPUs per node; a cell whose engine runs only on CUDA, for CUDA). Cells of one
    layout whose engines store DeepSpeed's files alike share one plan and one set of features (the planner's work
    is most of a study's planning: 70B at 16 ranks is ~700 files)."""
    shared: dict[tuple, tuple[dict, object, dict]] = {}
    calibrations: dict[str, dict] = {}
    cpus = target["cpus_per_node"]
    for cell in cells:
        spec = dataclasses.replace(cell.spec, device="cuda" if cell.spec.device == "cuda" else target["device"])
        plugins = resolve.plugins(spec)
        engine = plugins.engine
        key = (cell.model, cell.spec.shape, cell.layout, cell.nodes, cell.per_node, type(engine.files()), engine.saves)
        if key not in shared:
            made = forecast.build(plugins, cpus, store)
            f = feats.of(plugins, cpus, store["write_bytes_per_s"], store["read_bytes_per_s"],
                         store.get("metadata_ops_per_s"), store.get("env_metadata_ops_per_s"))
            shared[key] = (plan_record(plugins), f, made)
        else:
            _, f, first = shared[key]
            calibration = calibrations.setdefault(cell.spec.calibration, fit.load(cell.spec.calibration))
            made = {**first, **prediction_model.predict(plugins, f, calibration)}
            made["note"] = sorted(set(made.pop("notes")) | {n for n in first["note"] if n.startswith("start-up")})
        cell.plan = {**shared[key][0], "names": ("predicted" if engine.planned_names else "sizes only")
                     if engine.saves else "none"}
        cell.prediction = {"device": spec.device, "calibration": made["calibration"],
                           "storage": made["storage"], "phases": made["phases"], "note": made["note"]}


# CPU-seconds a rank's start costs here, mostly imports (docs/testing.md: about 7 a rank; a forking launcher pays
# them once per node): the calibration's emulated runs all had 2 ranks, so it cannot say what 16 cost on 2 cores
RANK_START_CPU_SECONDS = 7.0


def run_seconds(made: dict, spec, cpus: int = 1, forks: bool = False) -> float | None:
    """A run's wall seconds from its predicted phases: two launches (the checkpoint phase starts as a restart
    does), its steps, saves and the load, and the harness's own; at least its ranks' start-up CPU-seconds over the
    node's CPUs. None where a phase it needs is not predicted."""
    phases = made["phases"]

    def s(name: str) -> float | None:
        p = phases.get(name) or {}
        return 0.0 if p.get("absent") else p.get("seconds")

    start = [s(f"restart_{p}_seconds") for p in ("launch", "imports", "dist_init", "model_build", "engine_init")]
    step, save, load = s("restart_first_step_seconds"), s("save_commit_seconds"), s("restart_checkpoint_load_seconds")
    if None in (*start, step, save, load):
        return None
    starts = 2 * max(sum(start), (1 if forks else spec.ranks_per_node) * RANK_START_CPU_SECONDS / max(1, cpus))
    return HARNESS_SECONDS + starts + (spec.iters + spec.after) * step + spec.save_count * save + load


@dataclass
class Sizing:
    """What options are weighed against: the disk a cell may fill, the storage and CPUs predictions assume, and
    the machine factor (measured run wall seconds over estimated: the load, what the calibration missed)."""

    disk: int
    store: dict
    cpus: int
    factor: float
    fidelity: str
    run_words: list[str]
    local: bool  # the runs start here (not submitted to a scheduler)
    cache: dict = field(default_factory=dict)


def _ladder(cell: Cell, fidelity: str) -> list[tuple[str, int, bool]]:
    """(mode, shrink, emulate) candidates, most faithful first, within what fidelity= allows."""
    emulates = resolve.engine_class(cell.engine).emulates
    out = [("real", 1, False), *[("emulated", 1, True)] * emulates, *[("shrunk", k, emulates) for k in SHRINKS]]
    return [c for c in out if fidelity in ("auto", c[0])]


def evaluate(cell: Cell, mode: str, shrink: int, emulate: bool, sizing: Sizing) -> Option:
    """One candidate: its spec checked as a run's (preflight: the engine, the launcher, memory, the disk), its
    checkpoint bytes and estimated seconds; the reason where it cannot run here."""
    key = (cell.index, mode, shrink)
    if key in sizing.cache:
        return sizing.cache[key]
    words = [w for w in cell.tokens if not w.startswith(("nodes=", "ranks_per_node="))]
    # a launcher that starts ranks here: every rank on this node
    nodes, per_node = (1, cell.gpus) if sizing.local and cell.nodes > 1 else (cell.nodes, cell.per_node)
    words += [f"nodes={nodes}", f"ranks_per_node={per_node}"]
    words += [f"emulate={'true' if emulate else 'false'}", f"shrink={shrink}"]
    if emulate and sizing.local and not any(w.startswith("emulate_memory_gib=") for w in words):
        # runs one after another, unattended, on a machine others may share: less of its memory than a lone run's 60%
        budget = STUDY_EMULATE_MEMORY_FRACTION * (machine.available_memory_bytes() or 8 << 30) / GIB
        words.append(f"emulate_memory_gib={budget:.3f}")
    option = Option(mode, shrink, emulate)
    try:
        spec = machine.resolve(parse_run(words)[0])
        option.plugins = plugins = preflight.run(spec)
        option.bytes = preflight.planned_bytes(plugins)
        option.seconds = run_seconds(forecast.build(plugins, sizing.cpus, sizing.store), spec, sizing.cpus,
                                     forks=plugins.launcher.forks_ranks)
    except UsageError as exc:
        option.reason = str(exc)
    sizing.cache[key] = option
    return option


def choose(cell: Cell, allowance: float, sizing: Sizing, least: bool = False) -> Option:
    """The most faithful option of the cell that fits the disk and `allowance` seconds; with least, the least
    costly that fits (more cells rather than more fidelity), unless a more faithful one costs about as much (a small
    model's real size). Else predicted, saying why the others were not taken."""
    if cell.runs_here:
        return Option("predicted", reason=f"its engine does not run here: {cell.runs_here}",
                      why=shorten(cell.runs_here.split(" (")[0].split("; ")[0], 90))
    if sizing.fidelity == "predicted":
        return Option("predicted", reason="fidelity=predicted", why="fidelity=predicted")
    ladder = _ladder(cell, sizing.fidelity)
    if not ladder:
        return Option("predicted", why=f"fidelity={sizing.fidelity}: not for engine {cell.engine}",
                      reason=f"fidelity={sizing.fidelity}: engine {cell.engine} cannot be emulated (DeepSpeed builds "
                             "it inside deepspeed.initialize)")
    why: list[str] = []
    if sizing.fidelity == "auto":  # the cheapest that runs: nothing fits when it does not
        low = cheapest(cell, sizing, why)
        if low is None:
            memory = why and preflight.MEMORY_REFUSAL in why[0]  # the least costly option does not fit memory
            return Option("predicted", reason=REASONS.join(why) or "nothing to run",
                          why="no option fits the memory available now" if memory else "no option runs here")
        if low.seconds * sizing.factor > allowance:
            return Option("predicted", time_bound=True, why="no time left for a run",
                          reason=f"no run fits the time it may take ({clock(allowance)}): the quickest, {low.text}, "
                                 f"~{clock(low.seconds * sizing.factor)}")
        why = []
    for candidate in ladder:
        o = evaluate(cell, *candidate, sizing)
        if not _fits(o, sizing, why):
            continue
        if sizing.fidelity == "auto" and least and o is not low and o.seconds > 1.15 * low.seconds + 2:
            if candidate[0] == "shrunk":
                return dataclasses.replace(low, reason="more cells rather than more fidelity, once each model and "
                                                       "engine has had a run")
            continue
        if sizing.fidelity == "auto" and o.seconds * sizing.factor > allowance:
            why.append(f"{o.text}: ~{clock(o.seconds * sizing.factor)}, more than {clock(allowance)}")
            continue
        return dataclasses.replace(o, reason=REASONS.join(why))
    return Option("predicted", reason=REASONS.join(why) or "nothing to run", why=shorten(why[-1] if why else "", 90),
                  time_bound=any("more than" in w and "disk=" not in w for w in why))


def cheapest(cell: Cell, sizing: Sizing, why: list[str] | None = None) -> Option | None:
    """The least costly option of the cell that runs here, fits the disk and has a predicted time (None: none)."""
    why = [] if why is None else why
    options = (evaluate(cell, *candidate, sizing) for candidate in reversed(_ladder(cell, "auto")))
    return next((o for o in options if _fits(o, sizing, why)), None)


def _fits(o: Option, sizing: Sizing, why: list[str]) -> bool:
    """The option can run here and fits the disk, and its time is predicted; else why not, added to why."""
    if o.reason:
        why.append(f"{o.text}: {shorten(o.reason)}")
    elif o.bytes > sizing.disk:
        why.append(f"{o.text}: {size_text(o.bytes)} of checkpoints, more than disk={size_text(sizing.disk)}")
    elif o.seconds is None:
        why.append(f"{o.text}: its time is not predicted (calibration {o.plugins.spec.calibration})")
    else:
        return True
    return False


def shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def priority(cells: list[Cell]) -> tuple[list[Cell], list[Cell]]:
    """(coverage, the rest) of the cells whose engine runs here: the reference layouts, then the first cell (fewest
    GPUs) of each model and engine not yet covered; then the others, model and engine in turn."""
    runnable = [c for c in cells if c.runs_here is None]
    coverage = [c for c in runnable if c.reference]
    covered = {c.pair for c in coverage}
    by_pair: dict[tuple[str, str], list[Cell]] = {}
    for c in sorted((c for c in runnable if not c.reference), key=lambda c: (c.gpus, c.index)):
        by_pair.setdefault(c.pair, []).append(c)
    for pair, group in by_pair.items():
        if pair not in covered:
            coverage.append(group.pop(0))
            covered.add(pair)
    rest = [c for turn in itertools.zip_longest(*by_pair.values()) for c in turn if c is not None]
    return coverage, rest


def next_option(cell: Cell, later: list[Cell] | None, time_left: float, sizing: Sizing) -> Option:
    """A cell's option now (docs/study.md#sized-before-it-starts): a coverage cell (later: the coverage cells after
    it) its cheapest option plus an equal share of the time their cheapest runs leave; after the coverage (later
    None), the cheapest that fits what is left; a named fidelity, that one, whatever the time."""
    if sizing.fidelity != "auto":
        return choose(cell, math.inf, sizing)
    if later is None:
        return choose(cell, time_left, sizing, least=True)
    low = cheapest(cell, sizing)
    if low is None:
        return choose(cell, time_left, sizing)
    own = low.seconds * sizing.factor
    kept, runs = 0.0, 1
    for other in later:
        o = cheapest(other, sizing) if other.runs_here is None else None
        if o is not None and own + kept + o.seconds * sizing.factor <= time_left:
            kept += o.seconds * sizing.factor
            runs += 1
    return choose(cell, min(time_left, own + max(0.0, time_left - own - kept) / runs), sizing)
