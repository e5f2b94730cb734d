"""`./submit-job.sh study [models=3B,13B,70B] [gpus=8,16] [engines=...] [strategies=auto] [time_limit=25] ...`: the
reference study's table - for each model, each parallel strategy a GPU count allows and each engine, the checkpoint's
files and their sizes, the save and the restart - with every figure saying where it comes from (docs/study.md).

A cell is one (model, GPU count, strategy, engine). Every cell is planned (the planner's files, exact) and predicted
at its real size (the calibrated model, for the device). Cells whose engine runs here are then run, each as the most
faithful option that fits the disk and its share of the time: a real run, emulation at real size (the real files
written and read without training), or shrunk (shrink=K: the same file names and counts, smaller tensors; its
measurement checks the predictor at that size); the rest stay planned and predicted, with the reason. Each run is an
ordinary run folder inside the study's folder; study.json records the cells and is rewritten after each, so that
`resume=DIR` continues an interrupted study. analysis/study.py turns it into the table (CSV, Markdown, a report
section and plots).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from restart_harness import machine, preflight, resolve
from restart_harness.command.parse import Strategy, StudyRequest, parse_run
from restart_harness.errors import RunFailed, UsageError
from restart_harness.files.atomic import make_fresh_dir, read_json, write_json_atomic
from restart_harness.files.filesystem import filesystem, nearest_existing
from restart_harness.phases import say
from restart_harness.plan import checkpoint, estimate, rules
from restart_harness.schema import GIB, STUDY, STUDY_SCHEMA_VERSION
from restart_harness.spec.model_shape import load_model

# The reference study ran Megatron-DeepSpeed with GPT-2's tokenizer (--tokenizer-type GPT2BPETokenizer), whose 50,257
# tokens Megatron pads to a multiple of --make-vocab-size-divisible-by (128) x tp: 50,688 at tp=4, as its log says.
REFERENCE_VOCAB = 50257
MEGATRON_VOCAB_MULTIPLE = 128
SHRINKS = (2, 4, 8, 16, 32, 64)  # 64: the largest that keeps every preset's head dimension even and tp dividing FFN
MIN_STRATEGIES = 4  # auto: fewer placeable categories are made up from the other placeable layouts
# What a study spends outside its runs' launches, measured here (2 cores): planning ~0.1 s a cell; writing the table
# and its figures (matplotlib imported, six PNGs) 10-20 s. A run spends a few seconds outside its two launches
# (harness start, the page-cache step, finalize).
REPORT_SECONDS = 30.0
# An emulated cell's file state in memory at once, of the memory available when it is sized (a lone run takes 60%):
# on a shared 2-core machine two 8-rank 13B cells lost ranks to the OOM killer at 60% while other work grew
STUDY_EMULATE_MEMORY_FRACTION = 0.4
HARNESS_SECONDS = 8.0
MODES = ("real", "emulated", "shrunk", "predicted")  # most faithful first
REASONS = " | "  # between the reasons of the options not taken (a reason itself may hold "; ")


@dataclass(frozen=True)
class Reference:
    """A layout the reference study logged, with what its log says of the checkpoint."""

    model: str
    tp: int
    pp: int
    dp: int
    checkpoint_gb: float  # as printed: Megatron-DeepSpeed's "Checkpoint Save GB", 14 bytes x parameters / 10^9
    files: tuple[str, ...]
    source: str


REFERENCES = (
    Reference("3B", 4, 1, 1, 43.83, (
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt",
        "bf16_zero_pp_rank_0_mp_rank_02_optim_states.pt", "bf16_zero_pp_rank_0_mp_rank_03_optim_states.pt",
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt", "mp_rank_02_model_states.pt",
        "mp_rank_03_model_states.pt"),
        "github.com/mauryaavinash95/llm-restart-perf run_scripts/3B-output/CKPTAPPR0-TP4-ITER-37/"
        "log-3B-tp4-pp1-dp1-gbs16-mbs-16-ckpt0-iter37.log (2025-10-01, 4 A100s of one Polaris node): 'Checkpoint "
        "Save GB: 43.83' (Megatron-DeepSpeed's 14 bytes x 4 x 782,674,944 parameters) and the 8 files its ranks "
        "logged saving"),
)


# ---- strategies ------------------------------------------------------------------------------------------------
def vocab_size(shape, tp: int, vocab: str) -> int:
    """The vocabulary a cell's model has: the preset's, or the reference study's GPT-2 vocabulary padded for tp."""
    if vocab == "preset":
        return shape.vocab_size
    multiple = MEGATRON_VOCAB_MULTIPLE * tp
    return -(-REFERENCE_VOCAB // multiple) * multiple


def placement(gpus: int, per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a GPU count; one node when it holds them all."""
    if gpus <= per_node:
        return 1, gpus
    if gpus % per_node:
        raise UsageError(f"gpus={gpus}: not a whole number of nodes of gpus_per_node={per_node}; accepted: a "
                         f"multiple of {per_node}, or at most {per_node} (one node)")
    return gpus // per_node, per_node


def _undivided(shape, tp: int, vocab: str) -> str | None:
    dims = (("num_attention_heads", shape.num_attention_heads), ("num_key_value_heads", shape.num_key_value_heads),
            ("intermediate_size", shape.intermediate_size), ("vocab_size", vocab_size(shape, tp, vocab)))
    return next((f"{n}={v}" for n, v in dims if v % tp), None)


def tp_refusal(shape, tp: int, vocab: str) -> str | None:
    """Why tp cannot split the model (RunSpec's rule: tp divides heads, kv heads, FFN, vocabulary), or None."""
    bad = _undivided(shape, tp, vocab)
    if bad is None:
        return None
    fits = [t for t in range(1, shape.num_attention_heads + 1) if _undivided(shape, t, vocab) is None]
    return f"tp={tp} does not divide {bad}; accepted: tp in {', '.join(map(str, fits))}"


def pp_refusal(shape, pp: int) -> str | None:
    """Why pp cannot split the layers evenly (Megatron-DeepSpeed, which the reference study ran, needs equal
    stages: its number of layers a multiple of pp), or None."""
    layers = shape.num_hidden_layers
    if layers % pp == 0:
        return None
    return (f"pp={pp} does not divide the {layers} layers (equal stages, as Megatron-DeepSpeed needs); accepted: pp in "
            + ", ".join(str(p) for p in range(1, layers + 1) if layers % p == 0))


def state_bytes_per_gpu(spec) -> int:
    """The most model state one GPU of the layout holds: its weights and gradients (bf16 or fp32) and its ZeRO
    optimizer partition (fp32 master weights, two Adam moments); activations and buffers left out."""
    elem = checkpoint.ELEMENT_BYTES[spec.precision]
    most = 0
    for shard in checkpoint.shards(spec):
        n = shard.numel
        weights = elem * (rules.zero1_partition_numel(n, spec.dp) if spec.zero == 3 else n)
        grads = elem * (rules.zero1_partition_numel(n, spec.dp) if spec.zero >= 2 else n)
        most = max(most, weights + grads + 4 * checkpoint.OPTIMIZER_STATES * rules.zero1_partition_numel(n, spec.dp))
    return most


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    kind: str  # data, tensor, pipeline, tensor x pipeline, tensor x pipeline x data, ...

    @property
    def label(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}"


def kind_of(tp: int, pp: int, dp: int) -> str:
    parts = [name for name, d in (("tensor", tp), ("pipeline", pp), ("data", dp)) if d > 1]
    return " x ".join(parts) if parts else "one GPU"


def _powers(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def auto_layouts(shape, gpus: int, per_node: int, vocab: str) -> tuple[list[Layout], list[Layout]]:
    """(the named ones, the others) for this many GPUs, before the GPUs' memory is considered. Named: pure data,
    tensor and pipeline parallel, tensor x pipeline, and all three, in that order; tensor parallel within a node (a
    power of two dividing heads, kv heads, FFN, vocabulary), pipeline stages of equal layers, data parallel filling
    the rest. The others: every other such layout, data parallel 1 first."""
    tps = [t for t in _powers(min(gpus, per_node)) if gpus % t == 0 and tp_refusal(shape, t, vocab) is None]
    pps = [p for p in range(1, gpus + 1) if gpus % p == 0 and pp_refusal(shape, p) is None]
    T, P = max(tps), max(pps)
    wanted = [(1, 1), (T, 1), (1, P)]
    mixes = [(t, gpus // t) for t in sorted(tps, reverse=True) if 1 < t < gpus and gpus // t in pps]
    wanted += mixes[:1]
    wanted += [(t, p) for t in sorted(tps, reverse=True) for p in sorted(pps, reverse=True)
               if t > 1 and p > 1 and t * p < gpus and gpus % (t * p) == 0][:1]
    every = [(t, p) for t in sorted(tps, reverse=True) for p in sorted(pps)
             if gpus % (t * p) == 0]  # the rest, dp=1 first below
    every.sort(key=lambda tp_pp: (gpus // (tp_pp[0] * tp_pp[1]), -tp_pp[0]))
    named: list[Layout] = []
    others: list[Layout] = []
    for i, (t, p) in enumerate([*wanted, *every]):
        layout = Layout(t, p, gpus // (t * p), kind_of(t, p, gpus // (t * p)))
        if layout not in named and layout not in others:
            (named if i < len(wanted) else others).append(layout)
    return named, others


def user_layouts(shape, model: str, gpus: int, strategies: list[Strategy], vocab: str) -> list[Layout]:
    """The strategies given, for this many GPUs: each degree checked against the model's shape (one line naming it);
    a strategy whose degrees do not make this GPU count is left out of it."""
    out = []
    for s in strategies:
        if why := tp_refusal(shape, s.tp, vocab):
            raise UsageError(f"strategies={s.text}: for {model}: {why}")
        if why := pp_refusal(shape, s.pp):
            raise UsageError(f"strategies={s.text}: for {model}: {why}")
        dp = s.dp if s.dp is not None else gpus // (s.tp * s.pp)
        if s.tp * s.pp * dp != gpus or dp < 1:
            continue
        layout = Layout(s.tp, s.pp, dp, kind_of(s.tp, s.pp, dp))
        if layout not in out:
            out.append(layout)
    return out


# ---- cells -----------------------------------------------------------------------------------------------------
@dataclass
class Option:
    """How a cell is measured: mode (real, emulated, shrunk, predicted), the shrink factor, whether emulated, the
    estimated wall seconds (this machine's calibration, before the machine factor) and checkpoint bytes, and why."""

    mode: str
    shrink: int = 1
    emulate: bool = False
    seconds: float | None = None
    bytes: int = 0
    reason: str = ""
    why: str = ""  # a predicted cell's reason in a few words (the table's how column)
    time_bound: bool = False  # predicted for want of time (resume= may run it)
    plugins: object = None  # resolve.Plugins of the run (not recorded)

    def to_json(self) -> dict:
        return {"mode": self.mode, "shrink": self.shrink, "emulate": self.emulate,
                "estimate_seconds": None if self.seconds is None else round(self.seconds, 1), "bytes": self.bytes,
                "reason": self.reason, "why": self.why, "time_bound": self.time_bound}

    @property
    def text(self) -> str:
        if self.mode == "shrunk":
            return f"shrunk K={self.shrink} ({'emulated' if self.emulate else 'real run'})"
        return self.mode


@dataclass
class Cell:
    index: int
    model: str
    gpus: int
    nodes: int
    per_node: int
    layout: Layout
    engine: str
    tokens: list[str]  # the cell's run words at real size (model, layout, engine, vocabulary, run keys)
    spec: object  # RunSpec at real size, nominal placement
    reference: Reference | None = None
    gpu_state_bytes: int = 0  # state_bytes_per_gpu(spec)
    plan: dict = field(default_factory=dict)
    prediction: dict = field(default_factory=dict)
    runs_here: str | None = None  # None: its engine runs on this machine; else why not
    option: Option = field(default_factory=lambda: Option("predicted"))
    state: str = "planned"  # planned, pending, running, complete, failed, interrupted, submitted
    run_dir: str | None = None
    reason: str | None = None
    wall_seconds: float | None = None
    attempts: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.model}-{self.gpus}gpu-{self.layout.label}-{self.engine}"

    @property
    def pair(self) -> tuple[str, str]:
        return self.model, self.engine

    def to_json(self) -> dict:
        s = self.spec
        return {
            "index": self.index, "id": self.id, "model": self.model, "vocab_size": s.shape.vocab_size,
            "parameters": s.shape.num_parameters(), "gpus": self.gpus, "nodes": self.nodes,
            "gpus_per_node": self.per_node, "tp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp,
            "strategy": self.layout.label, "strategy_kind": self.layout.kind, "zero": s.zero, "engine": self.engine,
            "precision": s.precision, "device": self.prediction.get("device"),
            "gpu_state_bytes": self.gpu_state_bytes,
            "reference": dataclasses.asdict(self.reference) if self.reference else None,
            "plan": self.plan, "prediction": self.prediction, "runs_here": self.runs_here,
            "option": self.option.to_json(), "state": self.state, "run_dir": self.run_dir, "reason": self.reason,
            "wall_seconds": self.wall_seconds, "attempts": self.attempts,
        }


def _plan_record(plugins) -> dict:
    """The planner's view of a cell at real size, compact: every file (path, bytes, writing rank, kind) and what the
    study's table needs beside."""
    plan = estimate.build(plugins, bandwidth_gbps=None)
    return {"total_files": plan["total_files"],
            "total_bytes": plan["total_bytes"], "tensor_bytes": plan["tensor_bytes"],
            "restart_read_bytes": plan["restart_read_bytes"],
            "files": [[f["path"], f["bytes"], f["rank"], f["kind"]] for f in plan["files"]]}


def _device(request: StudyRequest) -> str:
    """The device the study's cells are on: device= among its run keys, else this machine's."""
    given = next((t.split("=", 1)[1] for t in request.run_tokens if t.startswith("device=")), "auto")
    return ("cuda" if machine.nvidia_devices() else "cpu") if given == "auto" else given


def build_cells(request: StudyRequest) -> tuple[list[Cell], list[str]]:
    """Every cell in table order (model, GPU count, strategy, engine), the reference layouts with them; and, per
    model and GPU count, what could not be placed. Refuses a model no strategy places on any of the GPU counts."""
    o = request.options
    cells: list[Cell] = []
    notes: list[str] = []
    device = _device(request)
    run_words = [t for t in request.run_tokens if not t.startswith("device=")]
    devices: dict[str, str] = {}
    for model in request.models:
        shape = load_model(model)[0]
        counts = [(g, None) for g in request.gpu_counts]
        if o.reference:
            counts += [(r.tp * r.pp * r.dp, r) for r in REFERENCES if r.model == model]
        placed_any, least = False, None
        for gpus, ref in sorted(counts, key=lambda c: (c[0], c[1] is None)):
            nodes, per_node = placement(gpus, o.gpus_per_node) if ref is None else (1, gpus)
            if ref is not None:
                layouts = [Layout(ref.tp, ref.pp, ref.dp, "reference: " + kind_of(ref.tp, ref.pp, ref.dp))]
            elif request.strategies is None:
                named, others = auto_layouts(shape, gpus, per_node, o.vocab)
                layouts = named + others
            else:
                layouts = user_layouts(shape, model, gpus, request.strategies, o.vocab)
            kept, needs = [], {}
            for layout in layouts:
                spec = _spec(model, layout, nodes, per_node, request.engines[0], shape, o, run_words, device)
                needs[layout] = need = state_bytes_per_gpu(spec)
                if o.gpu_memory_gib is not None and need > o.gpu_memory_gib * GIB:
                    if least is None or need < least[0]:
                        least = (need, layout.label, gpus)
                    continue
                kept.append(layout)
            if request.strategies is None and ref is None:
                kept = _auto_pick([lay for lay in kept if lay in named], [lay for lay in kept if lay not in named])
            if not kept:
                if layouts:
                    notes.append(f"{model} on {gpus} GPUs: no strategy's model state fits a GPU of "
                                 f"{o.gpu_memory_gib:g} GiB (gpu_memory_gib=)")
                else:
                    notes.append(f"{model} on {gpus} GPUs: none of strategies={o.strategies} makes {gpus} GPUs")
                continue
            placed_any = True
            for layout in kept:
                for engine in request.engines:
                    dev = devices.setdefault(engine, _engine_device(engine, device, model, layout, nodes, per_node,
                                                                    shape, o, run_words))
                    words = _words(model, layout, nodes, per_node, engine, shape, o, run_words, dev)
                    cells.append(Cell(len(cells) + 1, model, gpus, nodes, per_node, layout, engine, words,
                                      parse_run(words)[0], ref, needs[layout]))
        if not placed_any:
            raise UsageError(_unplaceable(model, request, least))
    return cells, notes


def _auto_pick(named: list[Layout], others: list[Layout]) -> list[Layout]:
    """The placeable named layouts, made up to MIN_STRATEGIES from the other placeable ones."""
    return named + others[:max(0, MIN_STRATEGIES - len(named))]


def _unplaceable(model: str, request: StudyRequest, least: tuple | None) -> str:
    o = request.options
    counts = ",".join(map(str, request.gpu_counts))
    if least is None:
        return (f"models={model}: none of strategies={o.strategies} places {model} on gpus={counts} (each strategy's "
                "tp x pp x dp must make the GPU count); accepted: strategies that do, or strategies=auto")
    need, label, gpus = least
    more = next((g for g in (2 ** i for i in range(1, 17)) if g > max(request.gpu_counts)
                 and _fits_some(model, g, request)), None)
    hint = f"gpus={more} places it, " if more else ""
    return (f"models={model}: no strategy places {model} on gpus={counts} of gpu_memory_gib={o.gpu_memory_gib:g}: the "
            f"least model state a GPU would hold is {need / GIB:,.1f} GiB ({label} on {gpus} GPUs: weights, gradients, "
            f"the ZeRO optimizer partition); accepted: more GPUs ({hint}or a larger gpu_memory_gib), "
            "gpu_memory_gib=none, or models= without it")


def _fits_some(model: str, gpus: int, request: StudyRequest) -> bool:
    o = request.options
    shape = load_model(model)[0]
    try:
        nodes, per_node = placement(gpus, o.gpus_per_node)
    except UsageError:
        return False
    named, others = auto_layouts(shape, gpus, per_node, o.vocab)
    for layout in [*named, *others]:
        spec = _spec(model, layout, nodes, per_node, "default", shape, o, [], "cpu")
        if state_bytes_per_gpu(spec) <= o.gpu_memory_gib * GIB:
            return True
    return False


def _engine_device(engine, device, *cell) -> str:
    """The device an engine's cells are predicted for: the study's, or CUDA for an engine that runs only there
    (DataStates-LLM), whose cells on a CPU machine are then predicted for the device it runs on."""
    for dev in dict.fromkeys((device, "cuda")):
        try:
            resolve.plugins(_spec(*cell[:4], engine, *cell[4:], dev)).engine.check()
            return dev
        except UsageError:
            continue
    return device


def _words(model, layout, nodes, per_node, engine, shape, o, run_words, device) -> list[str]:
    vocab = [f"vocab_size={vocab_size(shape, layout.tp, o.vocab)}"] if o.vocab == "reference" else []
    return [model, f"tp={layout.tp}", f"pp={layout.pp}", f"dp={layout.dp}", f"nodes={nodes}",
            f"ranks_per_node={per_node}", f"engine={engine}", *vocab, *run_words, f"device={device}",
            f"iters={o.saves}", "save_interval=1", "after=1"]


def _spec(model, layout, nodes, per_node, engine, shape, o, run_words, device):
    return parse_run(_words(model, layout, nodes, per_node, engine, shape, o, run_words, device))[0]


# ---- storage, predictions, options -------------------------------------------------------------------------------
ASSUMED_BANDWIDTH_MIB_S = 200.0  # for sizing only, where no baseline is cached yet (measured before the first run)


def storage(request: StudyRequest, cells: list[Cell], measure: bool) -> dict:
    """The storage every prediction assumes (forecast.storage): bandwidths stated (write_gbps=, read_gbps=), else the
    baseline of where the checkpoints go: cached, or measured now (measure=True), or, for sizing before anything is
    created, an assumed one that says so."""
    from restart_harness.files import baseline
    from restart_harness.predict import forecast

    p = request.predict
    plugins = resolve.plugins(cells[0].spec)
    extra = {"metadata_ops_s": p.metadata_ops_s, "env_metadata_ops_s": p.env_metadata_ops_s}
    if p.write_gbps is not None:
        store = forecast.storage(plugins, p.write_gbps, p.read_gbps, **extra)
        store["label"] = f"stated: write {p.write_gbps:g} GB/s, read {p.read_gbps:g} GB/s (aggregate)"
        return store
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
    store = forecast.storage(plugins, record=record, **extra)
    fs = filesystem(nearest_existing(Path(estimate.checkpoint_dir(spec))))
    store["label"] = (f"{fs['type'] or '?'} at {fs['mount']}: baseline write {record['write_mib_s']:,.0f} / read "
                      f"{record['read_mib_s']:,.0f} MiB/s ({record.get('method')}, "
                      f"{str(record.get('measured_at'))[:16]})")
    return store


def predict_cells(cells: list[Cell], store: dict, cpus: int) -> None:
    """Each cell's planned files and its predicted phases at real size (for the device it is on). Cells of one
    layout whose engines store DeepSpeed's files alike share one plan and one set of features (the planner's work
    is most of a study's planning: 70B at 16 ranks is ~700 files)."""
    from restart_harness.predict import features as feats
    from restart_harness.predict import fit, forecast
    from restart_harness.predict import model as prediction_model

    shared: dict[tuple, tuple[dict, object, dict]] = {}
    calibrations: dict[str, dict] = {}
    for cell in cells:
        plugins = resolve.plugins(cell.spec)
        engine = plugins.engine
        key = (cell.model, cell.spec.shape, cell.layout, cell.nodes, cell.per_node, type(engine.files()), engine.saves)
        if key not in shared:
            made = forecast.build(plugins, cpus, store)
            f = feats.of(plugins, cpus, store["write_bytes_per_s"], store["read_bytes_per_s"],
                         store.get("metadata_ops_per_s"), store.get("env_metadata_ops_per_s"))
            shared[key] = (_plan_record(plugins), f, made)
        else:
            plan, f, first = shared[key]
            calibration = calibrations.setdefault(cell.spec.calibration, fit.load(cell.spec.calibration))
            made = {**first, **prediction_model.predict(plugins, f, calibration)}
            made["note"] = sorted(set(made.pop("notes")) | {n for n in first["note"] if n.startswith("start-up")})
        plan = dict(shared[key][0])
        plan["names"] = ("predicted" if engine.planned_names else "sizes only") if engine.saves else "none"
        cell.plan = plan
        cell.prediction = {"device": cell.spec.device, "calibration": made["calibration"],
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
    out = [("real", 1, False)]
    if emulates:
        out.append(("emulated", 1, True))
    out += [("shrunk", k, emulates) for k in SHRINKS]
    if fidelity != "auto":
        out = [c for c in out if c[0] == fidelity]
    return out


def evaluate(cell: Cell, mode: str, shrink: int, emulate: bool, sizing: Sizing) -> Option:
    """One candidate: its spec checked as a run's (preflight: the engine, the launcher, memory, the disk), its
    checkpoint bytes and estimated seconds; the reason where it cannot run here."""
    from restart_harness.predict import forecast

    key = (cell.index, mode, shrink)
    if key in sizing.cache:
        return sizing.cache[key]
    words = [w for w in cell.tokens if not w.startswith(("nodes=", "ranks_per_node="))]
    if sizing.local and cell.nodes > 1:  # a launcher that starts ranks here: every rank on this node
        words += ["nodes=1", f"ranks_per_node={cell.gpus}"]
    else:
        words += [f"nodes={cell.nodes}", f"ranks_per_node={cell.per_node}"]
    words += [f"emulate={'true' if emulate else 'false'}", f"shrink={shrink}"]
    if emulate and sizing.local and not any(w.startswith("emulate_memory_gib=") for w in words):
        # runs one after another, unattended, on a machine others may share: less of its memory than a lone run's 60%
        budget = STUDY_EMULATE_MEMORY_FRACTION * (machine.available_memory_bytes() or 8 << 30) / GIB
        words.append(f"emulate_memory_gib={budget:.3f}")
    option = Option(mode, shrink, emulate)
    try:
        spec = machine.resolve(parse_run(words)[0])
        plugins = preflight.run(spec)
        option.plugins = plugins
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
                      why=_first(cell.runs_here.split(" (")[0].split("; ")[0], 90))
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
            return Option("predicted", reason=REASONS.join(why) or "nothing to run", why="no option runs here")
        if low.seconds * sizing.factor > allowance:
            return Option("predicted", time_bound=True, why="no time left for a run",
                          reason=f"no run fits the time it may take ({_clock(allowance)}): the quickest, {low.text}, "
                                 f"~{_clock(low.seconds * sizing.factor)}")
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
            why.append(f"{o.text}: ~{_clock(o.seconds * sizing.factor)}, more than {_clock(allowance)}")
            continue
        return dataclasses.replace(o, reason=REASONS.join(why))
    return Option("predicted", reason=REASONS.join(why) or "nothing to run", why=_first(why[-1] if why else "", 90),
                  time_bound=any("more than" in w and "disk=" not in w for w in why))


def cheapest(cell: Cell, sizing: Sizing, why: list[str] | None = None) -> Option | None:
    """The least costly option of the cell that runs here, fits the disk and has a predicted time (None: none)."""
    why = [] if why is None else why
    for candidate in reversed(_ladder(cell, "auto")):
        o = evaluate(cell, *candidate, sizing)
        if _fits(o, sizing, why):
            return o
    return None


def _fits(o: Option, sizing: Sizing, why: list[str]) -> bool:
    """The option can run here and fits the disk, and its time is predicted; else why not, added to why."""
    if o.reason:
        why.append(f"{o.text}: {_first(o.reason)}")
    elif o.bytes > sizing.disk:
        why.append(f"{o.text}: {_size(o.bytes)} of checkpoints, more than disk={_size(sizing.disk)}")
    elif o.seconds is None:
        why.append(f"{o.text}: its time is not predicted (calibration {o.plugins.spec.calibration})")
    else:
        return True
    return False


def _first(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _size(n: int) -> str:
    return estimate.size_text(n)


def _clock(seconds: float) -> str:
    return estimate.duration(seconds).replace(".0 ", " ")


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
    rest = []
    while any(by_pair.values()):
        for group in by_pair.values():
            if group:
                rest.append(group.pop(0))
    return coverage, rest


def next_option(cell: Cell, later: list[Cell] | None, time_left: float, sizing: Sizing) -> Option:
    """A cell's option now. A coverage cell (later: the coverage cells after it) may take its cheapest option plus an
    equal share of the time the coverage cells' cheapest runs leave (the time for those after it that fit kept for
    them): each model and engine gets a run before any gets a faithful one. After the coverage (later None), the
    cheapest that fits what is left. A named fidelity takes that, whatever the time."""
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


# ---- the study: checked, sized, run ------------------------------------------------------------------------------
@dataclass
class Study:
    request: StudyRequest
    cells: list[Cell]
    notes: list[str]
    sizing: Sizing
    started: float  # time.time() when the command started
    planning_seconds: float
    load: dict  # machine.load_now() when the study was sized
    folder: Path | None = None  # resume=: the study's folder; else made when it starts
    previous: dict | None = None  # resume=: the study.json it continues
    state: str = "running"
    ratios: list[float] = field(default_factory=list)  # run wall seconds / estimate, the runs so far

    @property
    def deadline(self) -> float:
        """When the last run must have ended: the time limit less the table's own time."""
        return self.started + self.request.options.time_limit * 60 - REPORT_SECONDS

    def to_run(self) -> list[Cell]:
        return [c for c in self.cells if c.state in ("pending", "running", "interrupted")
                or (c.state == "planned" and c.option.time_bound)]


def prior_factor(load: dict) -> float:
    """Run wall seconds over the calibration's estimate before any run here: 1 on a quiet machine, more as other
    work shares its CPUs (corrected by every run: Study.ratios)."""
    return round(1.0 + (load.get("loadavg_1min") or 0.0) / max(1, load.get("cpus") or 1), 2)


def check(request: StudyRequest) -> Study:
    """Every cell planned and predicted, the runs sized (projected: each is sized again before it starts), every
    refusal made - before anything is created."""
    started = time.time()
    o = request.options
    cells, notes = build_cells(request)
    previous = _previous(request, cells)
    sample = resolve.plugins(cells[0].spec)
    local = not sample.launcher.submits()
    cpus = request.predict.cpus_per_node or os.cpu_count() or 1
    store = storage(request, cells, measure=False)
    predict_cells(cells, store, cpus)
    device = _device(request)
    for cell in cells:
        cell.runs_here = _runs_here(cell, device)
    free = sample.target.storage_probe().free_bytes()
    disk = o.disk or max(1, (free or 0) // 2)
    load = machine.load_now()
    factor = prior_factor(load)
    if previous and previous.get("factor", {}).get("ratios"):
        factor = round(statistics.median(previous["factor"]["ratios"]), 2)
    run_words = [w for w in request.run_tokens if not w.startswith("device=")] + [f"device={device}"]
    sizing = Sizing(disk, store, cpus, factor, o.fidelity, run_words, local)
    planning = time.time() - started
    study = Study(request, cells, notes, sizing, started, planning, load,
                  folder=Path(o.resume).expanduser() if o.resume else None, previous=previous)
    if previous:
        study.ratios = list(previous.get("factor", {}).get("ratios") or [])
    least = planning + REPORT_SECONDS
    if o.time_limit * 60 < least:
        raise UsageError(f"time_limit={o.time_limit:g} min: the planned-only table alone takes ~{_clock(least)} here "
                         f"(planning {len(cells)} cells took {planning:.1f} s; the table and its figures ~"
                         f"{REPORT_SECONDS:.0f} s); accepted: time_limit >= {math.ceil(least / 6) / 10:g}")
    project(study)
    if o.fidelity not in ("auto", "predicted"):
        _check_named(study)
    return study


def _runs_here(cell: Cell, device: str) -> str | None:
    """None where the cell's engine can run on this machine's device (its own check); else why not."""
    spec = dataclasses.replace(cell.spec, device=device)
    try:
        resolve.plugins(spec).engine.check()
    except UsageError as exc:
        return str(exc)
    return None


def _previous(request: StudyRequest, cells: list[Cell]) -> dict | None:
    """resume=: the study.json continued, its cells' states carried over (cells are matched by id)."""
    if not request.options.resume:
        return None
    folder = Path(request.options.resume).expanduser()
    recorded = read_json(folder / STUDY)
    by_id = {c["id"]: c for c in recorded.get("cells", [])}
    for cell in cells:
        old = by_id.get(cell.id)
        if old is None:
            continue
        cell.state, cell.run_dir, cell.reason = old["state"], old.get("run_dir"), old.get("reason")
        cell.wall_seconds, cell.attempts = old.get("wall_seconds"), list(old.get("attempts") or [])
        o = old.get("option") or {}
        if old["state"] in ("complete", "failed", "submitted"):
            cell.option = Option(o.get("mode", "predicted"), o.get("shrink", 1), o.get("emulate", False),
                                 o.get("estimate_seconds"), o.get("bytes", 0), o.get("reason", ""))
        else:
            cell.option = Option("predicted", reason=o.get("reason", ""), why=o.get("why", ""),
                                 time_bound=old["state"] != "planned" or o.get("time_bound", False))
    return recorded


def project(study: Study) -> None:
    """Each cell's option as the run would choose it, on the clock of the estimates: what the study prints before
    it starts (each run is sized again, with the time truly left, before it starts)."""
    clock = time.time()
    sizing = study.sizing
    todo = study.to_run() if study.previous else list(study.cells)
    for cell in todo:
        cell.state = "planned"
        if cell.runs_here:
            cell.option = choose(cell, 0.0, sizing)
    coverage, rest = priority(todo)
    for i, cell in enumerate([*coverage, *rest]):
        cell.option = _next(cell, coverage[i + 1:] if i < len(coverage) else None, study.deadline - clock, sizing)
        if cell.option.mode != "predicted":
            cell.state = "pending"
            clock += cell.option.seconds * sizing.factor


def _next(cell: Cell, later: list[Cell] | None, time_left: float, sizing: Sizing) -> Option:
    if sizing.fidelity == "auto" and time_left < HARNESS_SECONDS * sizing.factor and not cell.runs_here:
        return Option("predicted", time_bound=True, why="no time left for a run",
                      reason="the time limit is spent by the runs before it")
    return next_option(cell, later, time_left, sizing)


def _check_named(study: Study) -> None:
    """fidelity=real|emulated|shrunk: every cell whose engine runs here gets it, or the study is refused."""
    o = study.request.options
    runs = [c for c in study.cells if c.option.mode != "predicted"]
    for cell in study.cells:
        if cell.runs_here is None and cell.option.mode == "predicted":
            misses = [r for r in cell.option.reason.split(REASONS) if "more than disk=" in r or "not predicted" in r]
            if misses:
                raise UsageError(f"fidelity={o.fidelity}: cell {cell.id} does not fit: {misses[0]}; accepted: a larger "
                                 "disk=, fidelity=auto (the largest option that fits, cell by cell), or fewer models")
    total = sum(c.option.seconds * study.sizing.factor for c in runs)
    left = study.deadline - time.time()
    if total > left:
        raise UsageError(f"fidelity={o.fidelity}: its {len(runs)} runs would take ~{_clock(total)} (the calibration's "
                         f"estimate x {study.sizing.factor:g} for this machine), more than the "
                         f"{_clock(max(0, left))} time_limit={o.time_limit:g} min leaves; accepted: time_limit >= "
                         f"{math.ceil((total + time.time() - study.started + REPORT_SECONDS) / 60)}, "
                         "fidelity=auto, or fewer models, strategies or engines")


# ---- running ---------------------------------------------------------------------------------------------------
class TimeUp(KeyboardInterrupt):
    """The study's time limit: raised in the main thread like Ctrl-C, so a run in progress is stopped and recorded
    as one interrupted would be."""


def _alarm(signum, frame):
    raise TimeUp()


def run(study: Study) -> Path:
    """Run the study's cells into its folder (study.json rewritten after each), then write the table; returns the
    folder. Ctrl-C stops it (resume= continues); the time limit stops the run in progress and ends the study."""
    request = study.request
    if study.folder is None:
        results = next((t.split("=", 1)[1] for t in request.run_tokens if t.startswith("results_dir=")), "results")
        try:
            study.folder = make_fresh_dir(Path(results), f"study-{datetime.now():%Y%m%d-%H%M%S}")
        except FileExistsError as exc:
            raise RunFailed(str(exc)) from None
    if study.sizing.store.get("assumed"):  # no baseline was cached: measured now, and the cells predicted with it
        study.sizing.store = storage(request, study.cells, measure=True)
        study.sizing.cache.clear()
        predict_cells(study.cells, study.sizing.store, study.sizing.cpus)
        project(study)
    print(render_plan(study), file=sys.stderr, flush=True)
    write(study)
    previous = signal.signal(signal.SIGALRM, _alarm)
    interrupted = None
    try:
        if request.options.fidelity != "predicted":
            left = study.deadline - time.time()
            if left <= 0:
                raise TimeUp()
            signal.setitimer(signal.ITIMER_REAL, left)
            _run_cells(study)
        study.state = "complete" if not any(c.state == "submitted" for c in study.cells) else "submitted"
    except TimeUp:
        study.state = "time_limit"
        _stop_remaining(study, f"the time limit (time_limit={request.options.time_limit:g} min) ended the study "
                               "before this cell's run")
    except KeyboardInterrupt as exc:
        study.state, interrupted = "interrupted", exc
        _stop_remaining(study, "the study was interrupted before this cell's run")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        write(study)
    _table(study)
    if interrupted is not None:
        say(f"[study] interrupted; continue it with: ./submit-job.sh study resume={study.folder}")
        raise interrupted
    return study.folder


def _stop_remaining(study: Study, reason: str) -> None:
    for cell in study.cells:
        if cell.state == "running":  # stopped outside its run's own handling (between its launches and records)
            cell.state, cell.reason = "interrupted", cell.reason or reason
        elif cell.state == "pending":
            cell.state = "planned"
            cell.option = Option("predicted", reason=reason, why="no time left for a run", time_bound=True)


def _run_cells(study: Study) -> None:
    """Each cell to run in priority order, sized again with the time truly left and the machine factor so far."""
    from restart_harness.phases.run import run as run_one

    sizing = study.sizing
    for cell in study.cells:  # submitted earlier (resume=): what their jobs did
        if cell.state == "submitted" and cell.run_dir:
            cell.state = _observed(cell)
    coverage, rest = priority([c for c in study.to_run()])
    order = [*coverage, *rest]
    total = sum(1 for c in order if c.state == "pending")
    done = 0
    for i, cell in enumerate(order):
        sizing.factor = _factor(study)
        option = _next(cell, coverage[i + 1:] if i < len(coverage) else None, study.deadline - time.time(), sizing)
        if option.mode == "predicted":
            cell.state, cell.option = "planned", option
            write(study)
            continue
        done += 1
        elapsed = time.time() - study.started
        left = max(0.0, study.deadline - time.time())
        say(f"[study {done}/{max(total, done)}] {_cell_text(cell)}: {option.text}, "
            f"~{_clock(option.seconds * sizing.factor)}; elapsed {_clock(elapsed)}, {_clock(left)} left")
        cell.option, cell.state, cell.reason = option, "running", None
        write(study)
        spec = dataclasses.replace(option.plugins.spec, results_dir=str(study.folder))
        began = time.time()
        try:
            cell.run_dir = str(run_one(option.plugins.with_spec(spec), prefix=f"{cell.index:03d}-"))
            cell.state = _observed(cell)
        except RunFailed as exc:
            cell.state, cell.reason = "failed", str(exc)
        except KeyboardInterrupt:
            cell.state = "interrupted"
            cell.reason = "the study's time limit" if isinstance(sys.exc_info()[1], TimeUp) else "interrupted"
            _made_run_dir(study, cell)
            _discard(study, cell)
            write(study)
            raise
        except Exception as exc:  # noqa: BLE001 - one broken cell must not end the study
            cell.state, cell.reason = "failed", f"{type(exc).__name__}: {exc}"
        cell.wall_seconds = round(time.time() - began, 1)
        _made_run_dir(study, cell)
        if cell.run_dir and cell.run_dir not in cell.attempts:
            cell.attempts.append(cell.run_dir)
        if sizing.local and option.seconds and (cell.state == "complete" or cell.wall_seconds > option.seconds):
            # a run that failed after outlasting its estimate says the estimates are short here too
            study.ratios.append(round(cell.wall_seconds / option.seconds, 3))
        if cell.state == "failed":
            _discard(study, cell)
        say(f"[study {done}] {cell.state}" + (f": {cell.reason}" if cell.reason else "")
            + f" in {_clock(cell.wall_seconds)}")
        write(study)


def _factor(study: Study) -> float:
    return round(statistics.median(study.ratios), 2) if study.ratios else study.sizing.factor


def _observed(cell: Cell) -> str:
    from restart_harness.rundir.status import observed

    state = observed(Path(cell.run_dir))["state"]
    return {"dry_run": "complete"}.get(state, state)


def _made_run_dir(study: Study, cell: Cell) -> None:
    if cell.run_dir is None:
        made = sorted(study.folder.glob(f"{cell.index:03d}-*"))
        cell.run_dir = str(made[-1]) if made else None
    if cell.run_dir and cell.run_dir not in cell.attempts:
        cell.attempts.append(cell.run_dir)


def _discard(study: Study, cell: Cell) -> None:
    """A failed or interrupted cell's checkpoint goes too (keep=false): its records say what it was."""
    from restart_harness.phases.run import discard_checkpoint

    if cell.run_dir is None or "keep=true" in study.request.run_tokens:
        return
    try:
        discard_checkpoint(resolve.read(Path(cell.run_dir)))
    except Exception as exc:  # noqa: BLE001 - a run that never wrote its spec has no checkpoint to delete
        say(f"  could not delete the checkpoint of {cell.run_dir}: {type(exc).__name__}: {exc}")


# ---- records -----------------------------------------------------------------------------------------------------
def record(study: Study) -> dict:
    request = study.request
    return {
        "schema_version": STUDY_SCHEMA_VERSION, "study_id": study.folder.name if study.folder else None,
        "command": ["study", *request.tokens] if not request.options.resume else
        (study.previous or {}).get("command", ["study", *request.tokens]),
        "state": study.state, "started": study.started, "updated": time.time(),
        "options": dataclasses.asdict(request.options), "models": request.models, "gpu_counts": request.gpu_counts,
        "engines": request.engines, "run_keys": request.run_tokens,
        "time_limit_seconds": request.options.time_limit * 60, "planning_seconds": round(study.planning_seconds, 2),
        "machine": {"host": os.uname().nodename, "load_at_start": study.load},
        "factor": {"prior": prior_factor(study.load), "ratios": study.ratios, "now": _factor(study)},
        "disk_bytes": study.sizing.disk, "storage": study.sizing.store.get("label"),
        "storage_source": study.sizing.store.get("source"),
        "storage_write_bytes_per_s": study.sizing.store.get("write_bytes_per_s"),
        "storage_read_bytes_per_s": study.sizing.store.get("read_bytes_per_s"),
        "not_placed": study.notes, "cells": [c.to_json() for c in study.cells],
    }


def write(study: Study) -> None:
    if study.folder is not None:
        write_json_atomic(study.folder / STUDY, record(study))


def _table(study: Study) -> None:
    """The study's table (analysis/study.py): CSV, Markdown, the report section and its figures."""
    try:
        from analysis import study as table
    except ImportError as exc:  # matplotlib missing: the cells are recorded; `report` writes the table later
        say(f"[study] no table written ({exc}); ./submit-job.sh report {study.folder} writes it where matplotlib is")
        return
    for path in table.write(study.folder):
        say(f"  wrote {path}")


# ---- what it prints ----------------------------------------------------------------------------------------------
def _cell_text(cell: Cell) -> str:
    ref = " (reference)" if cell.reference else ""
    return f"{cell.model} {cell.gpus} GPUs {cell.layout.label} {cell.engine}{ref}"


def render_plan(study: Study) -> str:
    """What the study will do, cell by cell for its runs and by reason for the rest; the time and bytes expected."""
    request, sizing = study.request, study.sizing
    cells = study.cells
    runs = [c for c in cells if c.option.mode != "predicted" and c.state in ("pending", "running")]
    kept = [c for c in cells if c.state in ("complete", "failed", "submitted")]
    expected = sum(c.option.seconds * sizing.factor for c in runs)
    models = len(request.models)
    ref = " and the reference layout" if request.options.reference else ""
    lines = [(f"[study] {len(cells)} cells ({models} model{'s' * (models > 1)}, GPU counts "
              f"{','.join(map(str, request.gpu_counts))}{ref},"
              f" engines {','.join(request.engines)}): every cell planned (exact files) and predicted (calibration "
              f"{cells[0].spec.calibration}, device {_device(request)})"),
             f"[study] storage for the predictions: {sizing.store.get('label')} ({sizing.store.get('source')})"]
    lines += [f"[study] not placed: {n}" for n in study.notes]
    if kept:
        lines.append(f"[study] resumed: {len(kept)} cells kept from {study.folder}")
    lines.append(f"[study] {len(runs)} runs expected to take ~{_clock(expected)} (the calibration's estimate x "
                 f"{sizing.factor:g}: this machine's {study.load.get('cpus')} CPUs at load "
                 f"{study.load.get('loadavg_1min')}; corrected after each run, each run sized again before it "
                 f"starts) of time_limit={request.options.time_limit:g} min; checkpoints up to "
                 f"{_size(max((c.option.bytes for c in runs), default=0))} at once (disk={_size(sizing.disk)}), "
                 f"{_size(sum(c.option.bytes for c in runs))} written in all")
    for c in runs:
        not_more = f"  (not more: {_first(c.option.reason.split(REASONS)[-1], 130)})" if c.option.reason else ""
        lines.append(f"  {_cell_text(c):<46} {c.option.text:<24} ~{_clock(c.option.seconds * sizing.factor):>8} "
                     f"{_size(c.option.bytes):>10}" + not_more)
    reasons: dict[str, int] = {}
    for c in cells:
        if c.option.mode == "predicted" and c.state == "planned":
            why = c.option.why or _first(c.option.reason, 90)
            reasons[why] = reasons.get(why, 0) + 1
    for why, n in reasons.items():
        lines.append(f"[study] planned and predicted only: {n} cells: {why}")
    return "\n".join(lines)


def main(study: Study) -> int:
    folder = run(study)
    recorded = read_json(folder / STUDY)
    counts: dict[str, int] = {}
    for c in recorded["cells"]:
        mode = c["option"]["mode"] if c["state"] == "complete" else ("predicted" if c["state"] == "planned"
                                                                     else c["state"])
        counts[mode] = counts.get(mode, 0) + 1
    print(f"study {recorded['study_id']}: {recorded['state']}; {len(recorded['cells'])} cells: "
          + ", ".join(f"{n} {m}" for m, n in counts.items()))
    for c in recorded["cells"]:
        ref = c.get("reference")
        if ref:
            plan = c["plan"]
            names = sorted(f[0] for f in plan["files"])
            same = names == sorted(ref["files"])
            gb = plan["total_bytes"] / 1e9
            print(f"reference {c['id']}: planner {gb:.2f} GB in {plan['total_files']} files; the reference study's log "
                  f"{ref['checkpoint_gb']:.2f} GB in {len(ref['files'])} files"
                  f" ({'equal' if round(gb, 2) == ref['checkpoint_gb'] and same else 'DIFFERENT'})")
    print(folder)
    failed = [c for c in recorded["cells"] if c["state"] == "failed"]
    return 1 if failed else 0
