"""The command line -> one validated request. Pure: reads only the files the command names (model presets, an
earlier run's spec.json), never checks or changes the machine (that is restart_harness/preflight.py). The training
stack, the engine and the storage target each check the keys they own (check()).

    ./submit-job.sh [run] MODEL key=value ...        one run; comma lists (key=a,b) or repeats>1 make a sweep
    ./submit-job.sh plan MODEL key=value ...         the checkpoint a run would write; launches nothing
    ./submit-job.sh restart run=RUN_DIR key=value    restart-only re-runs of an earlier run
    ./submit-job.sh baseline dir=PATH key=value      the storage's sequential write+fsync and cold read
    ./submit-job.sh report RUN_OR_SWEEP_DIR... [-o DIR]   tables and plots (analysis/)

Older spellings still work: `phase=restart run=DIR` is `restart run=DIR`; `MODEL ... plan=true|json` is `plan`.
Every key=value goes through keys.coerce() with its declaration; a key given twice, a malformed token, an unknown
key or a bad value is one UsageError line.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path as FsPath

from engines import registry
from restart_harness import resolve, stacks
from restart_harness.command.options import (
    MATRIX_STACK_CASES,
    MLPERF_FIXED,
    STUDY_FIXED,
    BaselineOptions,
    CalibrateOptions,
    CleanOptions,
    MatrixOptions,
    MlperfOptions,
    PlanOptions,
    PredictOptions,
    RestartOptions,
    StudyOptions,
)
from restart_harness.command.tokens import fill, options_of, pairs_of, required
from restart_harness.errors import UsageError, refused
from restart_harness.files.fsfacts import why_unresolvable
from restart_harness.spec import record as records
from restart_harness.spec.keys import MAX_VALUE_CHARS, Key, coerce, keys_of, parse_bool
from restart_harness.spec.model_shape import load_model, preset_named, preset_names, shape_keys
from restart_harness.spec.relayout import LAYOUT_KEYS, restart_layout
from restart_harness.spec.runspec import MAX_WORLD, RunSpec, plausible_rates, run_keys

COMMANDS = ("run", "plan", "predict", "calibrate", "restart", "baseline", "report", "matrix", "mlperf", "clean",
            "study", "endure")


@dataclass
class PlanRequest:
    spec: RunSpec
    options: PlanOptions
    target: RunSpec | None = None  # plan a restart at this layout too (to_tp, to_pp, to_dp)


@dataclass(frozen=True)
class RestartRequest:
    """An existing run resolved once, with the restart overrides applied, and how many restarts."""

    run: resolve.Run  # the run with the restarts' spec (completed on the node that launches them)
    original: RunSpec  # the run's spec as it was made (the layout that wrote the checkpoint)
    tokens: list[str]  # the overrides as given (key=value), handed on to a submitted restart-only job
    # what the check of the committed checkpoint's content read before anything launched (preflight.restart;
    # files/checksum.py), or None where its save recorded no checksums
    integrity: dict | None = None

    @property
    def run_dir(self) -> FsPath:
        return self.run.run_dir

    @property
    def spec(self) -> RunSpec:  # the restarts'
        return self.run.spec

    @property
    def repeats(self) -> int:
        return self.spec.repeats

    @property
    def relayout(self) -> bool:
        """The restart's layout differs from the one that wrote the checkpoint (tp, pp or dp)."""
        o = self.original
        return (self.spec.tp, self.spec.pp, self.spec.dp) != (o.tp, o.pp, o.dp)


@dataclass
class Combination:
    """One point of a sweep: the values that vary, the tokens that produce it, its validated RunSpec."""

    values: dict[str, str]
    tokens: list[str]
    spec: RunSpec
    plugins: resolve.Plugins | None = None  # once preflight has checked the combination


@dataclass
class SweepRequest:
    tokens: list[str]
    lists: dict[str, list[str]]
    combos: list[Combination]


# ---- tokens ------------------------------------------------------------------------------------------------
def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """(command, its tokens). The command word is optional (run); the older spellings map onto commands."""
    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if "phase=restart" in argv:
        return "restart", [t for t in argv if t != "phase=restart"]
    if any(t.startswith("plan=") for t in argv):
        plan = next(t for t in argv if t.startswith("plan="))
        value = plan.split("=", 1)[1].lower()
        if value == "json":
            return "plan", [t if t != plan else "plan=json" for t in argv]
        try:
            wanted = parse_bool("plan", value)
        except UsageError:
            raise UsageError(f"{plan}: accepted values are true, json, false (also 1, 0, yes, no, on, off)") from None
        rest = [t for t in argv if t != plan]
        return ("plan", rest) if wanted else ("run", rest)
    return "run", argv


def _unknown(name: str, value: str, accepted: list[str], engine: str | None = None) -> UsageError:
    owners = [e for e in registry.owner_of_option(name) if e != engine]
    if owners and engine is None:  # a command with no engine of its own (study)
        return refused(name, value, f"an option of engine {', '.join(owners)}, which this command does not take")
    if owners:
        takes = ", ".join(keys_of(resolve.engine_class(engine).Options)) or "no options"
        return refused(name, value, f"an option of engine {', '.join(owners)}, not of engine {engine}; engine "
                                    f"{engine} takes: {takes}")
    for command, options in (("plan", PlanOptions), ("predict", PredictOptions), ("baseline", BaselineOptions),
                             ("restart", RestartOptions)):
        if name in keys_of(options):
            return refused(name, value, f"a key of the {command} command; usage: ./submit-job.sh {command} ... "
                                        f"{name}=...")
    near = difflib.get_close_matches(name, accepted, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return UsageError(f"unknown key {name!r}{hint}; accepted keys are listed by ./submit-job.sh --help")


# ---- run -----------------------------------------------------------------------------------------------------
def parse_run(tokens: list[str], extra: dict[str, Key] | None = None) -> tuple[RunSpec, dict]:
    """`MODEL key=value ...` -> (resolved RunSpec, values of the `extra` keys). Raises UsageError on the first
    problem, naming it."""
    if not tokens:
        raise UsageError("missing MODEL; usage: ./submit-job.sh MODEL [key=value ...] (try: ./submit-job.sh tiny)")
    model, *rest = tokens
    if "=" in model:
        raise UsageError(f"{model!r}: the first argument must be a MODEL (preset name or config.json path)")
    shape, source = _model(model)
    model = preset_named(model) or model  # a preset by its own spelling: results name it one way
    pairs = pairs_of(rest)
    values: dict = {}
    pairs = fill(values, run_keys(), pairs)
    if "launcher" in values:  # an alias (launcher=deepspeed) is recorded as the launcher's name
        values["launcher"] = resolve.launcher_class(values["launcher"]).name
    stack = resolve.stack_named(values.get("stack", run_keys()["stack"].default))
    values.setdefault("engine", stack.default_engine)  # each stack's own: DeepSpeed's torch.save, DCP for FSDP2
    engine = resolve.engine_class(values["engine"])
    options: dict = {}
    pairs = fill(options, keys_of(engine.Options), pairs)
    shape_values: dict = {}
    pairs = fill(shape_values, shape_keys(), pairs)
    extra_values: dict = {}
    pairs = fill(extra_values, extra or {}, pairs)
    if pairs:
        name = next(iter(pairs))
        accepted = [*run_keys(), *shape_keys(), *keys_of(engine.Options), *(extra or {})]
        raise _unknown(name, pairs[name], accepted, engine.name)
    if shape_values:
        shape = dataclasses.replace(shape, **shape_values)
    defaults = dataclasses.asdict(engine.Options())
    spec = RunSpec(model=model, shape=shape, model_source=source, engine_options={**defaults, **options},
                   engine_option_defaults=defaults, **values).resolve()
    check(spec)
    return spec, extra_values


def _model(word: str) -> tuple:
    """The first word of a run: a model (a preset, an HF config, a .yaml preset); a word that is neither a model nor
    a command is said to be so, before the words after it are read."""
    if len(word) > MAX_VALUE_CHARS:
        raise UsageError(f"a first argument of {len(word):,} characters; accepted: a command or a MODEL")
    try:
        return load_model(word)
    except UsageError:
        if "/" in word or word.endswith((".yaml", ".yml", ".json")):
            raise
        raise UsageError(f"unknown model {word!r}, and not a command either; models: {', '.join(preset_names())}, an "
                         f"HF config.json or a .yaml preset; commands: {', '.join(COMMANDS)}") from None


def check(spec: RunSpec) -> None:
    """What the launcher, the training stack, the engine and the storage target say of spec (pure: no machine, no
    network)."""
    resolve.launcher_class(spec.launcher).check(spec)
    stack, engine = resolve.stack_class(spec), resolve.engine_class(spec.engine)
    if not stack.accepts_engine(engine):
        takers = [n for n, c in registry.all_engines().items() if stack.accepts_engine(c)]
        raise UsageError(stack.engine_refusal.format(engine=engine.name, stack=spec.stack, takers=", ".join(takers)))
    stack.check(spec)
    target = resolve.target_class(spec.ckpt_dir)
    if spec.ckpt_dir is not None:
        target.check_location(spec.ckpt_dir)
    where = f"ckpt_dir={spec.ckpt_dir}"
    if target.kind not in engine.target_kinds:
        takers = [n for n, c in registry.all_engines().items()
                  if target.kind in c.target_kinds and stack.accepts_engine(c)]
        raise UsageError(f"{where}: engine={engine.name} writes {_WRITES[engine.target_kinds[0]]}, not "
                         f"{_WRITES[target.kind]}; accepted with this ckpt_dir: engine={', '.join(takers)}")
    if spec.checksums == "on" and target.no_checksums:
        raise UsageError(f"checksums=on with {where}: {target.no_checksums}; accepted: checksums=auto|off, or a "
                         "ckpt_dir on a file system")
    if target.kind not in stack.target_kinds:
        raise UsageError(f"{where}: {stack.key_text} writes {_WRITES[stack.target_kinds[0]]}, not "
                         f"{_WRITES[target.kind]}; accepted with this ckpt_dir: {stack.key_text_off}")


_WRITES = {"posix": "to a file system", "object": "to object storage"}


def parse_plan(tokens: list[str]) -> PlanRequest:
    spec, values = parse_run(tokens, keys_of(PlanOptions))
    if not resolve.stack_class(spec).planned:
        raise UsageError(f"stack={spec.stack}: the planner predicts DeepSpeed's checkpoint files; accepted: "
                         f"{_planned_stacks()} (a "
                         f"stack={spec.stack} checkpoint is one DCP shard file per rank and .metadata)")
    options = PlanOptions(**values)
    plausible_rates(spec.shape, spec.world_size, {"bandwidth_gbps": options.bandwidth_gbps})
    target = None
    if any(v is not None for v in (options.to_tp, options.to_pp, options.to_dp)):
        if not resolve.engine_class(spec.engine).universal:
            raise UsageError(f"to_tp/to_pp/to_dp: engine={spec.engine} cannot restart at another layout (DeepSpeed's "
                             "universal-checkpoint converter reads torch.save files only); accepted: engine="
                             + ", ".join(n for n, c in registry.all_engines().items() if c.universal))
        try:
            target = spec.with_layout(tp=options.to_tp or spec.tp, pp=options.to_pp or spec.pp,
                                      dp=options.to_dp or spec.dp, ranks_per_node=None)
        except UsageError as exc:
            given = " ".join(f"to_{k}={v}" for k, v in (("tp", options.to_tp), ("pp", options.to_pp),
                                                        ("dp", options.to_dp)) if v is not None)
            raise UsageError(f"{given}: {exc}") from None
    return PlanRequest(spec, options, target)


def _planned_stacks() -> str:
    return ", ".join(f"stack={n}" for n, cls in stacks.all_stacks().items() if n in stacks.names() and cls.planned)


@dataclass
class PredictRequest:
    spec: RunSpec
    options: PredictOptions


def parse_predict(tokens: list[str]) -> PredictRequest:
    spec, values = parse_run(tokens, keys_of(PredictOptions))
    if not resolve.stack_class(spec).planned:
        raise UsageError(f"stack={spec.stack}: the prediction model builds on the planner, which predicts DeepSpeed's "
                         f"checkpoint files; accepted: {_planned_stacks()}")
    options = PredictOptions(**values)
    if (options.write_gbps is None) != (options.read_gbps is None):
        given = "write_gbps" if options.write_gbps is not None else "read_gbps"
        typed = next(t.split("=", 1)[1] for t in tokens if t.startswith(f"{given}="))
        raise refused(given, typed, "give write_gbps= and read_gbps= together", "both, or neither (the cached "
                      "baseline)")
    if options.crossover_min_bytes >= options.crossover_max_bytes:  # the key typed is the one named
        typed = {k: t.split("=", 1)[1] for t in tokens for k in ("crossover_min_bytes", "crossover_max_bytes")
                 if t.startswith(f"{k}=")}
        name = "crossover_min_bytes" if "crossover_min_bytes" in typed else "crossover_max_bytes"
        other = "crossover_max_bytes" if name == "crossover_min_bytes" else "crossover_min_bytes"
        raise refused(name, typed[name], f"{'not below' if name.endswith('min_bytes') else 'not above'} "
                      f"{other}={getattr(options, other):,}", "crossover_min_bytes below crossover_max_bytes (the "
                      "checkpoint sizes the crossover looks at)")
    plausible_rates(spec.shape, spec.world_size, dataclasses.asdict(options))
    return PredictRequest(spec, options)


def parse_calibrate(tokens: list[str]) -> CalibrateOptions:
    return options_of(CalibrateOptions, tokens, "calibrate")


def parse_clean(tokens: list[str]) -> CleanOptions:
    return options_of(CleanOptions, tokens, "clean")


def parse_baseline(tokens: list[str]) -> BaselineOptions:
    return options_of(BaselineOptions, tokens, "baseline")


def parse_matrix(tokens: list[str]) -> MatrixOptions:
    options = options_of(MatrixOptions, tokens, "matrix")
    if options.model is not None:
        load_model(options.model)  # an unknown preset: one line naming the accepted ones
    for layout in ([] if options.layouts == "auto" else options.layouts.split(",")):
        if not re.fullmatch(r"tp[1-9][0-9]*-pp[1-9][0-9]*-dp[1-9][0-9]*", layout):
            raise UsageError(f"layouts={options.layouts}: {layout!r} is not a layout; accepted: tpT-ppP-dpD, "
                             "e.g. tp2-pp2-dp1, comma-separated, or auto")
    resolve.launcher_class(options.launcher)  # an unknown one: one line naming the accepted ones
    if options.engines != "all":
        for name in options.engines.split(","):
            if name not in registry.names() and name not in MATRIX_STACK_CASES:
                raise UsageError(f"engines={options.engines}: unknown engine {name!r}; accepted: "
                                 f"{', '.join([*registry.names(), *MATRIX_STACK_CASES])}, or all")
    return options


# ---- mlperf ----------------------------------------------------------------------------------------------------
@dataclass
class MlperfRequest:
    """An MLPerf Storage checkpoint workload as harness runs: the workload, its options, and the run spec every one
    of its runs uses (None: no workload given, the table of workloads)."""

    workload: object | None  # plan.mlperf.Workload
    options: MlperfOptions
    spec: RunSpec | None
    tokens: list[str]
    plugins: resolve.Plugins | None = None  # once preflight has checked the workload's runs


def parse_mlperf(tokens: list[str]) -> MlperfRequest:
    """`mlperf [WORKLOAD] [runs=N] [checkpoints=N] [reads=N] [run keys ...]`: the workload's preset, layout and ZeRO
    stage, emulated (DeepSpeed's own files without GPUs), `checkpoints` saves and a cold read per restart."""
    from restart_harness.plan import mlperf

    if not tokens:
        return MlperfRequest(None, MlperfOptions(), None, [])
    name, *rest = tokens
    if "=" in name:
        raise UsageError(f"{name!r}: the first argument of mlperf must be a workload; accepted: "
                         f"{', '.join(mlperf.WORKLOADS)} (or none: the table of workloads)")
    workload = mlperf.get(name)
    pairs = pairs_of(rest)
    if "dry_run" in pairs:
        raise refused("dry_run", pairs["dry_run"], "not taken by mlperf; `./submit-job.sh mlperf` (no workload) prints "
                      f"the workloads, `./submit-job.sh plan {workload.preset} {' '.join(workload.layout_tokens)}` "
                      "the files of one checkpoint")
    fixed = [k for k in pairs if k in MLPERF_FIXED or k in shape_keys()]
    if fixed:
        raise refused(fixed[0], pairs[fixed[0]], f"fixed by the MLPerf workload {workload.name} ({workload.preset}, "
                      f"TPxPPxDP {workload.tp}x{workload.pp}x{workload.dp}, ZeRO-{workload.zero}, emulated, every "
                      "checkpoint fsync'd, cold reads); scale it down with shrink=K")
    values: dict = {}
    fill(values, keys_of(MlperfOptions), dict(pairs))
    checkpoints = values.get("checkpoints", MlperfOptions.checkpoints)
    declared = run_keys()
    if "subset" in pairs and coerce(declared["subset"], pairs["subset"]):  # MLPerf's subset: one host of 8 GPUs
        per_node = coerce(declared["ranks_per_node"], pairs.setdefault("ranks_per_node", "8"))
        pairs.setdefault("nodes", str(max(1, workload.ranks // per_node)))
    pairs.setdefault("keep", "false")  # each run's checkpoints deleted after its reads, as MLPerf's tool reuses its
    spec, values = parse_run([workload.preset, *workload.layout_tokens, "emulate=true", "engine=default",
                              "cache=drop", f"iters={checkpoints}", "save_interval=1",
                              *(f"{k}={v}" for k, v in pairs.items())], keys_of(MlperfOptions))
    return MlperfRequest(workload, MlperfOptions(**values), spec, rest)


# ---- study -----------------------------------------------------------------------------------------------------
_DEGREE = r"(tp[1-9][0-9]*|pp[1-9][0-9]*|dp(?:[1-9][0-9]*)?)"
_STRATEGY = re.compile(rf"^{_DEGREE}(-{_DEGREE})*$")


@dataclass(frozen=True)
class Strategy:
    """A parallel layout asked for by degrees: dp None fills each GPU count (tp x pp x dp = GPUs)."""

    tp: int
    pp: int
    dp: int | None
    text: str


@dataclass
class StudyRequest:
    """`study [key=value ...]`: what the study covers and the run keys every cell takes (campaigns/study/)."""

    options: StudyOptions
    predict: PredictOptions  # the storage and CPUs predictions assume (write_gbps=, read_gbps=, ...)
    run_tokens: list[str]  # run keys (key=value) every cell's run takes
    models: list[str]
    gpu_counts: list[int]
    engines: list[str]
    strategies: list[Strategy] | None  # None: auto
    tokens: list[str]  # the command's words, recorded in study.json (resume= runs them again)


def _study_list(name: str, text: str, what: str) -> list[str]:
    values = text.split(",")
    if any(v == "" for v in values) or len(set(values)) != len(values):
        raise UsageError(f"{name}={text}: needs distinct, non-empty {what}, comma-separated")
    return values


def parse_strategy(text: str) -> Strategy:
    """tp4, pp2, dp, tp4-pp2, tp2-pp2-dp2: degrees by name, each at most once; dp without a number fills the GPUs."""
    if not _STRATEGY.match(text):
        raise UsageError(f"strategies={text}: not a strategy; accepted: tpT, ppP, dp and their mixes joined by -, "
                         "e.g. tp4-pp2, tp2-pp2-dp2, dp (or auto)")
    degrees: dict[str, int | None] = {}
    for part in text.split("-"):
        name, number = part[:2], part[2:]
        if name in degrees:
            raise UsageError(f"strategies={text}: {name} given twice")
        degrees[name] = int(number) if number else None
    return Strategy(degrees.get("tp") or 1, degrees.get("pp") or 1, degrees.get("dp"), text)


def parse_study(tokens: list[str]) -> StudyRequest:
    """`study [study keys] [predict keys: write_gbps= ...] [run keys]`; with resume=DIR, the words study.json recorded
    (time_limit= may be given anew)."""
    if tokens and "=" not in tokens[0]:
        raise UsageError(f"{tokens[0]!r}: study takes no MODEL; usage: ./submit-job.sh study [models=3B,13B,70B] "
                         "[gpus=8,16] [key=value ...]")
    pairs = pairs_of(tokens)
    if "resume" in pairs:
        pairs = _resumed(pairs)
    fixed = [k for k in pairs if k in STUDY_FIXED or k in shape_keys()]
    if fixed:
        raise UsageError(f"{fixed[0]}=: set by the study for each cell (its layout, engine and option: a real run, "
                         "emulation, shrunk, predicted); accepted: the study keys (./submit-job.sh study --help) and "
                         "the other run keys")
    values: dict = {}
    rest = fill(values, keys_of(StudyOptions), pairs)
    predict_values: dict = {}
    rest = fill(predict_values, {k: v for k, v in keys_of(PredictOptions).items() if k != "predict"}, rest)
    declared = run_keys()
    for name, text in rest.items():
        if name not in declared:
            raise _unknown(name, text, [*keys_of(StudyOptions), *keys_of(PredictOptions), *declared])
        coerce(declared[name], text)
    options = StudyOptions(**values)
    predict = PredictOptions(**predict_values)
    if (predict.write_gbps is None) != (predict.read_gbps is None):
        given = "write_gbps" if predict.write_gbps is not None else "read_gbps"
        raise UsageError(f"{given}=: give write_gbps= and read_gbps= together (or neither: the cached baseline)")
    models = _study_list("models", options.models, "model presets")
    for model in models:
        try:
            shape = load_model(model)[0]
        except UsageError as exc:
            raise UsageError(f"models={options.models}: {exc}" if "/" in model or model.endswith((".yaml", ".json"))
                             else f"models={options.models}: unknown model {model!r}; accepted: "
                                  f"{', '.join(preset_names())}, a .yaml preset or an HF config.json") from None
        plausible_rates(shape, 1, dataclasses.asdict(predict))
    gpu_counts = []
    for text in _study_list("gpus", options.gpus, "GPU counts"):
        if not (text.isascii() and text.isdigit()) or int(text) < 1 or int(text) > MAX_WORLD:
            raise UsageError(f"gpus={options.gpus}: {text!r} is not a GPU count; accepted: positive integers up to "
                             f"{MAX_WORLD:,}, comma-separated, e.g. gpus=8,16")
        gpu_counts.append(int(text))
    engines = _study_engines(options.engines, resolve.stack_named(declared["stack"].default))  # stack= is fixed
    strategies = (None if options.strategies == "auto" else
                  [parse_strategy(t) for t in _study_list("strategies", options.strategies, "strategies")])
    pairs_run = {**rest, "keep": rest.get("keep", "false")}  # each cell's checkpoint deleted once its records are
    return StudyRequest(options, predict, [f"{k}={v}" for k, v in pairs_run.items()], models, gpu_counts, engines,
                        strategies, list(tokens))


def _study_engines(text: str, stack: type[stacks.Stack]) -> list[str]:
    """engines=: the engines named (+NAME,...: the key's default, the reference study's, then these), each one that
    saves a checkpoint of the stack the cells run."""
    every = registry.all_engines()
    engines = keys_of(StudyOptions)["engines"].default.split(",") if text.startswith("+") else []
    for name in _study_list("engines", text.removeprefix("+"), "engine names"):
        if name not in every:
            raise UsageError(f"engines={text}: unknown engine {name!r}; accepted: "
                             + ", ".join(n for n, c in every.items() if c.saves))
        cls = resolve.engine_class(name)
        if not cls.saves:
            raise UsageError(f"engines={text}: engine {name} writes no checkpoint; accepted: "
                             + ", ".join(n for n, c in every.items() if c.saves))
        if not stack.accepts_engine(cls):
            raise UsageError(f"engines={text}: engine {name} does not checkpoint {stack.key_text}; accepted: "
                             + ", ".join(n for n, c in every.items() if c.saves and stack.accepts_engine(c)))
        if name not in engines:
            engines.append(name)
    return engines


def _resumed(pairs: dict[str, str]) -> dict[str, str]:
    """resume=DIR: the words the study was started with (its study.json), and a new time_limit= if given."""
    import json

    from restart_harness.schema import STUDY

    folder = FsPath(coerce(keys_of(StudyOptions)["resume"], pairs["resume"])).expanduser()
    others = [k for k in pairs if k not in ("resume", "time_limit", "results_dir")]
    if others:
        raise UsageError(f"{others[0]}=: resume= continues a study with its own keys; accepted with it: time_limit=")
    try:
        recorded = json.loads((folder / STUDY).read_text())
        words = [w for w in recorded["command"] if w != "study"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"resume={pairs['resume']}: not a study folder (no readable {STUDY}); accepted: the folder "
                         "a study printed") from None
    resumed = {k: v for k, v in pairs_of([w for w in words if not w.startswith(("resume=", "time_limit="))]).items()}
    return {**resumed, "resume": pairs["resume"], **({"time_limit": pairs["time_limit"]} if "time_limit" in pairs
                                                      else {})}


# ---- sweeps ----------------------------------------------------------------------------------------------------
def is_sweep(tokens: list[str]) -> bool:
    """A comma list in MODEL or any value, or repeats > 1."""
    if any("," in t for t in tokens):
        return True
    return any(t.startswith("repeats=") and t.split("=", 1)[1] not in ("1", "+1") for t in tokens[1:])


def parse_sweep(tokens: list[str]) -> SweepRequest:
    """Expand MODEL key=a,b ... into its product and validate every combination before anything is written."""
    if not tokens:
        parse_run(tokens)  # the usual "missing MODEL" line
    pairs = {"MODEL": tokens[0], **pairs_of(tokens[1:])}
    declared = run_keys()
    lists: dict[str, list[str]] = {}
    for name, text in pairs.items():
        values = text.split(",")
        if len(values) > 1:
            if name in declared and not declared[name].sweep:
                raise UsageError(f"{name}={text}: a sweep takes one {name}")
            if any(v == "" for v in values) or len(set(values)) != len(values):
                raise UsageError(f"{name}={text}: a sweep list needs distinct, non-empty values")
            lists[name] = values
    runs = math.prod(len(v) for v in lists.values())
    runs *= coerce(declared["repeats"], pairs["repeats"]) if "repeats" in pairs else 1
    limit = coerce(declared["max_runs"], pairs["max_runs"]) if "max_runs" in pairs else declared["max_runs"].default
    if runs > limit:
        sizes = " x ".join([*(f"{len(v)} {k}" for k, v in lists.items()),
                            *([f"{pairs['repeats']} repeats"] if "repeats" in pairs else [])])
        raise UsageError(f"the sweep expands to {runs:,} runs ({sizes}), more than max_runs={limit}; give "
                         f"max_runs={runs} to run them all")
    combos = []
    for choice in itertools.product(*lists.values()):
        chosen = dict(zip(lists, choice, strict=True))
        merged = {**pairs, **chosen}
        combo_tokens = [merged.pop("MODEL"), *(f"{k}={v}" for k, v in merged.items())]
        try:
            spec, _ = parse_run(combo_tokens)
        except UsageError as exc:
            where = " ".join(f"{k}={v}" for k, v in chosen.items())
            raise UsageError(f"{exc} (in the sweep combination {where})" if where else str(exc)) from None
        combos.append(Combination(chosen, combo_tokens, spec))
    return SweepRequest(tokens, lists, combos)


# ---- restart-only re-runs -------------------------------------------------------------------------------------
def restart_keys() -> dict[str, Key]:
    """What a restart-only re-run may change (nothing the ranks' checkpoint depends on)."""
    return {k: v for k, v in run_keys().items() if v.restart}


def parse_restart(tokens: list[str], complete: Callable[[RunSpec], RunSpec]) -> RestartRequest:
    """`restart run=RUN_DIR [key=value ...]`: the run's spec.json with the overrides applied, `complete`d unless a job
    of its own launches the restarts, resolved once. The run's status and checkpoint are checked in preflight."""
    if tokens and "=" not in tokens[0]:
        raise UsageError(f"{tokens[0]!r}: restart takes no MODEL (the run's spec.json has it); "
                         "usage: ./submit-job.sh restart run=RUN_DIR [cache=warm] [repeats=N]")
    pairs = pairs_of(tokens)
    pairs.pop("phase", None)  # `phase=restart` spelled as a key
    options: dict = {}
    pairs = fill(options, keys_of(RestartOptions), pairs)
    required(keys_of(RestartOptions), options, "restart")
    if why := why_unresolvable(options["run"]):
        raise refused("run", options["run"], why, "the run directory an earlier run printed")
    run = records.read(FsPath(options["run"]).expanduser())  # its record: resolved once, with the restarts' spec
    allowed = restart_keys()
    # the engine's options that act only at restart (how it reads: engine=lazy's read_io, readers, broadcast_load)
    engine_allowed = {k: v for k, v in keys_of(resolve.engine_class(run.spec.engine).Options).items() if v.restart}
    overrides: dict = {}
    engine_overrides: dict = {}
    for name, text in pairs.items():
        if name in engine_allowed and name not in allowed:
            engine_overrides[name] = coerce(engine_allowed[name], text)
            continue
        if name not in allowed and name not in run_keys() and name not in shape_keys() \
                and name not in keys_of(resolve.engine_class(run.spec.engine).Options):
            raise _unknown(name, text, ["run", *allowed, *engine_allowed], run.spec.engine)
        if name not in allowed:
            fixed = "(fixed by its spec.json)" if name not in ("dry_run", "results_dir", "max_runs") else \
                f"(its restarts are launched into the run's own folder: it takes no {name})"
            raise refused(name, text, f"cannot change for a restart of an existing run {fixed}",
                          f"with restart: run, {', '.join([*allowed, *engine_allowed])}")
        overrides[name] = coerce(allowed[name], text)
    if "launcher" in overrides:
        overrides["launcher"] = resolve.launcher_class(overrides["launcher"]).name
    if engine_overrides:
        overrides["engine_options"] = {**run.spec.engine_options, **engine_overrides}
    spec = dataclasses.replace(run.spec, **overrides, phase="restart", dry_run=False)
    if LAYOUT_KEYS & overrides.keys():
        spec = restart_layout(spec, run.spec, overrides.keys(), resolve.stack_class(spec).check)
        if "threads" not in overrides:
            spec = dataclasses.replace(spec, threads=None)  # this node's CPUs over the new ranks per node
    spec = spec if resolve.launcher_class(spec.launcher).submits() else complete(spec)  # threads at a new layout
    return RestartRequest(resolve.of_record(run, spec=spec), run.spec, [f"{k}={v}" for k, v in pairs.items()])
