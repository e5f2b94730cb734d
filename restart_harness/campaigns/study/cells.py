"""The study's cells: the models (the reference study's vocabulary), the strategies a GPU count and a model's shape
and memory allow, the reference layout, and each cell's real-size spec (docs/study.md#the-cells)."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

from restart_harness import machine, resolve
from restart_harness.command.parse import Strategy, StudyRequest, parse_run
from restart_harness.errors import UsageError
from restart_harness.plan import checkpoint, estimate, rules
from restart_harness.schema import GIB
from restart_harness.spec.model_shape import load_model

# The reference study ran Megatron-DeepSpeed with GPT-2's tokenizer (--tokenizer-type GPT2BPETokenizer), whose 50,257
# tokens Megatron pads to a multiple of --make-vocab-size-divisible-by (128) x tp: 50,688 at tp=4, as its log says.
REFERENCE_VOCAB = 50257
MEGATRON_VOCAB_MULTIPLE = 128
MIN_STRATEGIES = 4  # auto: fewer placeable categories are made up from the other placeable layouts


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
    Reference("3B", 4, 1, 1, 43.83, (*(f"bf16_zero_pp_rank_0_mp_rank_{i:02d}_optim_states.pt" for i in range(4)),
                                     *(f"mp_rank_{i:02d}_model_states.pt" for i in range(4))),
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
        n, part = shard.numel, rules.zero1_partition_numel(shard.numel, spec.dp)
        weights, grads = elem * (part if spec.zero == 3 else n), elem * (part if spec.zero >= 2 else n)
        most = max(most, weights + grads + 4 * checkpoint.OPTIMIZER_STATES * part)
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


def auto_layouts(shape, gpus: int, per_node: int, vocab: str) -> tuple[list[Layout], list[Layout]]:
    """(the named ones, the others) for this many GPUs, before the GPUs' memory is considered (docs/study.md#the-cells):
    named, pure data, tensor and pipeline parallel, tensor x pipeline, and all three; the others, data parallel 1
    first."""
    tps = [t for t in (1 << i for i in range(min(gpus, per_node).bit_length()))
           if gpus % t == 0 and tp_refusal(shape, t, vocab) is None]
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
    named, others = [], []
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
        if why := tp_refusal(shape, s.tp, vocab) or pp_refusal(shape, s.pp):
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
            "wall_seconds": self.wall_seconds, "attempts": self.attempts}


def plan_record(plugins) -> dict:
    """The planner's view of a cell at real size, compact: every file (path, bytes, writing rank, kind) and what the
    study's table needs beside."""
    plan = estimate.build(plugins, bandwidth_gbps=None)
    return {"total_files": plan["total_files"],
            "total_bytes": plan["total_bytes"], "tensor_bytes": plan["tensor_bytes"],
            "restart_read_bytes": plan["restart_read_bytes"],
            "files": [[f["path"], f["bytes"], f["rank"], f["kind"]] for f in plan["files"]]}


def study_device(request: StudyRequest) -> str:
    """The device the study's cells are on: device= among its run keys, else this machine's."""
    given = next((t.split("=", 1)[1] for t in request.run_tokens if t.startswith("device=")), "auto")
    return ("cuda" if machine.nvidia_devices() else "cpu") if given == "auto" else given


def build_cells(request: StudyRequest) -> tuple[list[Cell], list[str]]:
    """Every cell in table order (model, GPU count, strategy, engine), the reference layouts with them; and, per
    model and GPU count, what could not be placed. Refuses a model no strategy places on any of the GPU counts."""
    o = request.options
    cells: list[Cell] = []
    notes: list[str] = []
    device = study_device(request)
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
            if request.strategies is None and ref is None:  # the placeable named ones, made up to MIN_STRATEGIES
                others = [lay for lay in kept if lay not in named]
                kept = [lay for lay in kept if lay in named]
                kept += others[:max(0, MIN_STRATEGIES - len(kept))]
            if not kept:
                notes.append(f"{model} on {gpus} GPUs: " + (
                    f"no strategy's model state fits a GPU of {o.gpu_memory_gib:g} GiB (gpu_memory_gib=)" if layouts
                    else f"none of strategies={o.strategies} makes {gpus} GPUs"))
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
            f"least model state a GPU would hold is {estimate.size_text(need)} ({label} on {gpus} GPUs: weights, gradients, "
            f"the ZeRO optimizer partition); accepted: more GPUs ({hint}or a larger gpu_memory_gib), "
            "gpu_memory_gib=none, or models= without it")


def _fits_some(model: str, gpus: int, request: StudyRequest) -> bool:
    o = request.options
    shape = load_model(model)[0]
    try:
        nodes, per_node = placement(gpus, o.gpus_per_node)
    except UsageError:
        return False
    return any(state_bytes_per_gpu(_spec(model, layout, nodes, per_node, "default", shape, o, [], "cpu"))
               <= o.gpu_memory_gib * GIB
               for layouts in auto_layouts(shape, gpus, per_node, o.vocab) for layout in layouts)


def _engine_device(engine, device, *cell) -> str:
    """The device an engine's cells are predicted for: the study's, or CUDA for an engine that runs only there
    (DataStates-LLM), whose cells on a CPU machine are then predicted for the device it runs on."""
    for dev in dict.fromkeys((device, "cuda")):
        with contextlib.suppress(UsageError):
            resolve.plugins(_spec(*cell[:4], engine, *cell[4:], dev)).engine.check()
            return dev
    return device


def _words(model, layout, nodes, per_node, engine, shape, o, run_words, device) -> list[str]:
    vocab = [f"vocab_size={vocab_size(shape, layout.tp, o.vocab)}"] if o.vocab == "reference" else []
    return [model, f"tp={layout.tp}", f"pp={layout.pp}", f"dp={layout.dp}", f"nodes={nodes}",
            f"ranks_per_node={per_node}", f"engine={engine}", *vocab, *run_words, f"device={device}",
            f"iters={o.saves}", "save_interval=1", "after=1"]


def _spec(model, layout, nodes, per_node, engine, shape, o, run_words, device):
    return parse_run(_words(model, layout, nodes, per_node, engine, shape, o, run_words, device))[0]
