"""The command line -> one validated request. Pure: reads only the files the command names (model presets, an
earlier run's spec.json), never checks or changes the machine (that is restart_harness/preflight.py).

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
import json
import re
from dataclasses import MISSING, dataclass
from pathlib import Path as FsPath

from restart_harness.errors import UsageError
from restart_harness.spec.keys import Key, Path, Size, coerce, key, keys_of
from restart_harness.spec.model_shape import load_model, shape_keys
from restart_harness.spec.runspec import RunSpec, run_keys

COMMANDS = ("run", "plan", "restart", "baseline", "report", "matrix")
_TOKEN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass
class PlanOptions:
    plan: str = key("text", "output: text (a table) or json", group="plan", choices=("text", "json"))
    bandwidth_gbps: float | None = key(None, "storage bandwidth for the estimate (both directions); default: the "
                                             "cached storage baseline of the checkpoint directory's file system",
                                       group="plan", unit="GB/s = 10^9 bytes/s", above=0)
    to_tp: int | None = key(None, "plan a restart at another layout too: its tensor-parallel degree (default the "
                                  "run's); shows the universal checkpoint and what each rank reads of it",
                            group="plan", minimum=1)
    to_pp: int | None = key(None, "... its pipeline-parallel degree (default the run's)", group="plan", minimum=1)
    to_dp: int | None = key(None, "... its data-parallel degree (default the run's)", group="plan", minimum=1)


@dataclass
class BaselineOptions:
    dir: Path = key(MISSING, "the directory (file system) to measure, e.g. dir=/scratch/ckpt, or an object store: "
                             "dir=s3://bucket/prefix (PUT and GET)", group="baseline")
    tool: str = key("auto", "auto = fio when installed, else the built-in probe", group="baseline",
                    choices=("auto", "fio", "builtin"))
    file_bytes: Size = key(Size(64 << 20), "bytes each rank writes and reads", group="baseline", unit="bytes",
                           minimum=1)
    ranks: int | None = key(None, "concurrent writers/readers; default the CPU count, at most 8", group="baseline",
                            minimum=1)


# The matrix's cases beyond DeepSpeed's engines: another training stack with its engine (docs/fsdp2.md).
MATRIX_STACK_CASES = {"fsdp2-dcp": ["stack=fsdp2", "engine=dcp"]}


@dataclass
class MatrixOptions:
    device: str = key("auto", "auto = cuda when NVIDIA devices are present, else cpu (the CPU subset)",
                      group="matrix", choices=("auto", "cpu", "cuda"))
    model: str | None = key(None, "model preset; default 1B on cuda, tiny on cpu", group="matrix")
    engines: str = key("all", "comma list of engines (and fsdp2-dcp: stack=fsdp2 with DCP), or all (every engine "
                              "that saves, and fsdp2-dcp)", group="matrix")
    layouts: str = key("auto", "comma list of layouts as tpT-ppP-dpD, or auto: those that fit the node's devices "
                               "(cpu: tp1-pp1-dp2 and tp2-pp2-dp1)", group="matrix")
    gpus: int | None = key(None, "devices on the node (default: the NVIDIA devices found)", group="matrix", minimum=1)
    results_dir: Path = key(Path("results/matrix"), "where the matrix's runs, matrix.json and its report go",
                            group="matrix")


@dataclass
class RestartOptions:
    run: Path = key(MISSING, "the run directory an earlier run printed", group="restart")


@dataclass
class PlanRequest:
    spec: RunSpec
    options: PlanOptions
    target: RunSpec | None = None  # plan a restart at this layout too (to_tp, to_pp, to_dp)


@dataclass
class RestartRequest:
    """An existing run directory, its RunSpec with the restart overrides applied, and how many restarts."""

    run_dir: FsPath
    spec: RunSpec
    ckpt_root: FsPath
    repeats: int
    tokens: list[str]  # the overrides as given (key=value), handed on to a submitted restart-only job
    original: RunSpec | None = None  # the run's own spec (the layout that wrote the checkpoint)
    checkpoint_url: str | None = None  # s3://... where the run's checkpoint objects are (ckpt_dir=s3://...)

    @property
    def reshard(self) -> bool:
        """The restart's layout differs from the one that wrote the checkpoint (tp, pp or dp)."""
        o = self.original
        return o is not None and (self.spec.tp, self.spec.pp, self.spec.dp) != (o.tp, o.pp, o.dp)


@dataclass
class Combination:
    """One point of a sweep: the values that vary, the tokens that produce it, its validated RunSpec."""

    values: dict[str, str]
    tokens: list[str]
    spec: RunSpec


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
            wanted = parse_bool_text(value)
        except ValueError:
            raise UsageError(f"{plan}: accepted values are true, json, false") from None
        rest = [t for t in argv if t != plan]
        return ("plan", rest) if wanted else ("run", rest)
    return "run", argv


def parse_bool_text(text: str) -> bool:
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


def pairs_of(tokens: list[str]) -> dict[str, str]:
    """key=value tokens -> {key: text}; each key at most once."""
    pairs: dict[str, str] = {}
    for token in tokens:
        match = _TOKEN.match(token)
        if not match:
            raise UsageError(f"{token!r}: malformed argument; expected key=value")
        name, value = match.groups()
        if name in pairs:
            raise UsageError(f"{name}: given twice ({name}={pairs[name]} and {token})")
        pairs[name] = value
    return pairs


def _unknown(name: str, accepted: list[str], engine: str | None = None) -> UsageError:
    from engines import registry

    owners = [e for e in registry.owner_of_option(name) if e != engine]
    if owners:
        return UsageError(f"{name}=: an option of engine {', '.join(owners)}, not of engine {engine}; "
                          f"engine {engine} takes: {', '.join(keys_of(registry.get(engine).Options)) or 'no options'}")
    for command, options in (("plan", PlanOptions), ("baseline", BaselineOptions), ("restart", RestartOptions)):
        if name in keys_of(options):
            return UsageError(f"{name}=: a key of the {command} command; usage: ./submit-job.sh {command} ... {name}=...")
    near = difflib.get_close_matches(name, accepted, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return UsageError(f"unknown key {name!r}{hint}; accepted keys are listed by ./submit-job.sh --help")


def _fill(target: dict, declared: dict[str, Key], pairs: dict[str, str]) -> dict[str, str]:
    """Coerce the pairs declared in `declared` into target; returns the pairs left over."""
    rest = {}
    for name, text in pairs.items():
        if name in declared:
            target[name] = coerce(declared[name], text)
        else:
            rest[name] = text
    return rest


def _required(declared: dict[str, Key], values: dict, command: str) -> None:
    for name, k in declared.items():
        if k.required and name not in values:
            raise UsageError(f"{command} needs {name}=: {k.help}")


# ---- run -----------------------------------------------------------------------------------------------------
def parse_run(tokens: list[str], extra: dict[str, Key] | None = None) -> tuple[RunSpec, dict]:
    """`MODEL key=value ...` -> (resolved RunSpec, values of the `extra` keys). Raises UsageError on the first
    problem, naming it."""
    from engines import registry

    if not tokens:
        raise UsageError("missing MODEL; usage: ./submit-job.sh MODEL [key=value ...] (try: ./submit-job.sh tiny)")
    model, *rest = tokens
    if "=" in model:
        raise UsageError(f"{model!r}: the first argument must be a MODEL (preset name or config.json path)")
    pairs = pairs_of(rest)
    shape, source = load_model(model)
    values: dict = {}
    pairs = _fill(values, run_keys(), pairs)
    if "engine" not in values:  # each stack's own default: DeepSpeed's torch.save, DCP for FSDP2
        values["engine"] = "dcp" if values.get("stack") == "fsdp2" else "default"
    engine = registry.get(values["engine"])
    options: dict = {}
    pairs = _fill(options, keys_of(engine.Options), pairs)
    shape_values: dict = {}
    pairs = _fill(shape_values, shape_keys(), pairs)
    extra_values: dict = {}
    pairs = _fill(extra_values, extra or {}, pairs)
    if pairs:
        name = next(iter(pairs))
        accepted = [*run_keys(), *shape_keys(), *keys_of(engine.Options), *(extra or {})]
        raise _unknown(name, accepted, engine.name)
    if shape_values:
        shape = dataclasses.replace(shape, **shape_values)
    engine_options = {**dataclasses.asdict(engine.Options()), **options}
    spec = RunSpec(model=model, shape=shape, model_source=source, engine_options=engine_options, **values)
    if spec.stack not in engine.stacks:
        takers = [n for n, c in registry.all_engines().items() if spec.stack in c.stacks]
        raise UsageError(f"engine={engine.name} does not checkpoint stack={spec.stack}; accepted with "
                         f"stack={spec.stack}: engine={', '.join(takers)}")
    _check_object_target(spec, engine)
    return spec.resolve(), extra_values


def _check_object_target(spec, engine) -> None:
    """ckpt_dir=s3://...: a well-formed URL, an engine that writes objects, no emulation (machine checks, such as
    the bucket and the credentials, are preflight's)."""
    from engines import registry
    from restart_harness.storage.s3 import S3Url, is_s3

    if not is_s3(spec.ckpt_dir):
        return
    try:
        S3Url.parse(spec.ckpt_dir)
    except ValueError as exc:
        raise UsageError(f"ckpt_dir={spec.ckpt_dir}: {exc}") from None
    if not engine.s3:
        takers = [n for n, c in registry.all_engines().items() if c.s3 and spec.stack in c.stacks]
        raise UsageError(f"ckpt_dir={spec.ckpt_dir}: engine={engine.name} writes to a file system, not to object "
                         f"storage; accepted with an s3:// ckpt_dir: engine={', '.join(takers)}")
    if spec.emulate:
        raise UsageError(f"ckpt_dir={spec.ckpt_dir}: emulate=true writes to a file system; accepted with an s3:// "
                         "ckpt_dir: emulate=false")


def parse_plan(tokens: list[str]) -> PlanRequest:
    spec, values = parse_run(tokens, keys_of(PlanOptions))
    if spec.stack != "deepspeed":
        raise UsageError(f"stack={spec.stack}: the planner predicts DeepSpeed's checkpoint files; accepted: "
                         "stack=deepspeed (a stack=fsdp2 checkpoint is one DCP shard file per rank and .metadata)")
    options = PlanOptions(**values)
    target = None
    if any(v is not None for v in (options.to_tp, options.to_pp, options.to_dp)):
        target = dataclasses.replace(spec, tp=options.to_tp or spec.tp, pp=options.to_pp or spec.pp,
                                     dp=options.to_dp or spec.dp, ranks_per_node=None)
        target.resolve_layout()
    return PlanRequest(spec, options, target)


def _options(cls: type, tokens: list[str], command: str):
    """A command's own options (a dataclass of key() fields) from its tokens: unknown keys and missing required
    ones refused with one line naming what the command accepts."""
    declared = keys_of(cls)
    values: dict = {}
    rest = _fill(values, declared, pairs_of(tokens))
    if rest:
        name = next(iter(rest))
        raise UsageError(f"{name}={rest[name]}: not a {command} key; {command} accepts "
                         f"{', '.join(f'{k}=' for k in declared)}")
    _required(declared, values, command)
    return cls(**values)


def parse_baseline(tokens: list[str]) -> BaselineOptions:
    return _options(BaselineOptions, tokens, "baseline")


def parse_matrix(tokens: list[str]) -> MatrixOptions:
    options = _options(MatrixOptions, tokens, "matrix")
    if options.model is not None:
        load_model(options.model)  # an unknown preset: one line naming the accepted ones
    for layout in ([] if options.layouts == "auto" else options.layouts.split(",")):
        if not re.fullmatch(r"tp[1-9][0-9]*-pp[1-9][0-9]*-dp[1-9][0-9]*", layout):
            raise UsageError(f"layouts={options.layouts}: {layout!r} is not a layout; accepted: tpT-ppP-dpD, "
                             "e.g. tp2-pp2-dp1, comma-separated, or auto")
    if options.engines != "all":
        from engines import registry

        for name in options.engines.split(","):
            if name not in registry.names() and name not in MATRIX_STACK_CASES:
                raise UsageError(f"engines={options.engines}: unknown engine {name!r}; accepted: "
                                 f"{', '.join([*registry.names(), *MATRIX_STACK_CASES])}, or all")
    return options


# ---- sweeps ----------------------------------------------------------------------------------------------------
def sweep_keys() -> dict[str, Key]:
    return {k: v for k, v in run_keys().items() if v.sweep}


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


def parse_restart(tokens: list[str]) -> RestartRequest:
    """`restart run=RUN_DIR [key=value ...]`: the run's spec.json with the overrides applied. The run's status and
    checkpoint are checked in preflight."""
    if tokens and "=" not in tokens[0]:
        raise UsageError(f"{tokens[0]!r}: restart takes no MODEL (the run's spec.json has it); "
                         "usage: ./submit-job.sh restart run=RUN_DIR [cache=warm] [repeats=N]")
    pairs = pairs_of(tokens)
    pairs.pop("phase", None)  # `phase=restart` spelled as a key
    options: dict = {}
    pairs = _fill(options, keys_of(RestartOptions), pairs)
    _required(keys_of(RestartOptions), options, "restart")
    allowed = restart_keys()
    overrides: dict = {}
    for name, text in pairs.items():
        if name not in allowed:
            raise UsageError(f"{name}=: cannot change for a restart of an existing run (fixed by its spec.json); "
                             f"accepted with restart: run, {', '.join(allowed)}")
        overrides[name] = coerce(allowed[name], text)
    run_dir = FsPath(options["run"]).expanduser()
    if not (run_dir / "spec.json").is_file():
        raise UsageError(f"run={options['run']}: not a run directory (no spec.json)")
    run_dir = run_dir.resolve()
    data = json.loads((run_dir / "spec.json").read_text())
    original = RunSpec.from_json(data)
    spec = dataclasses.replace(original, **overrides)
    spec.phase, spec.dry_run = "restart", False
    if LAYOUT_KEYS & overrides.keys():
        _relayout(spec, original, overrides)
    given = [f"{k}={v}" for k, v in pairs.items()]
    return RestartRequest(run_dir=run_dir, spec=spec, ckpt_root=FsPath(data["checkpoint_root"]),
                          checkpoint_url=data.get("checkpoint_url"),
                          repeats=spec.repeats, tokens=given, original=original)


LAYOUT_KEYS = frozenset({"tp", "pp", "dp", "nodes", "ranks_per_node"})


def _relayout(spec: RunSpec, original: RunSpec, overrides: dict) -> None:
    """A restart at another layout: keys not given keep the run's values (ranks per node follows); the model
    must fit the new layout; the global batch stays the run's (micro-batch and accumulation adjusted), so the first
    step after the restart trains on the same samples as at the original layout."""
    if "ranks_per_node" not in overrides:
        spec.ranks_per_node = None
    if "dp" not in overrides and "ranks_per_node" in overrides:
        spec.dp = None
    spec.resolve_layout()
    batch = original.global_batch
    if batch % spec.dp:
        raise UsageError(f"dp={spec.dp}: the run's global batch of {batch} samples (micro_batch {original.micro_batch} "
                         f"x grad_accum {original.grad_accum} x dp {original.dp}) does not split over {spec.dp} "
                         "data-parallel ranks; accepted: dp dividing it")
    per_rank = batch // spec.dp
    spec.micro_batch = max(m for m in range(1, min(original.micro_batch, per_rank) + 1) if per_rank % m == 0)
    spec.grad_accum = per_rank // spec.micro_batch
