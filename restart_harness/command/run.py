"""`[run] MODEL key=value ...`: one run's RunSpec, checked by its launcher, stack, engine and storage target; comma
lists (key=a,b) or repeats>1 make a sweep, every combination validated before anything is written."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math

from engines import registry
from restart_harness import resolve
from restart_harness.command.options import BaselineOptions, PlanOptions, PredictOptions, RestartOptions
from restart_harness.command.requests import Combination, SweepRequest
from restart_harness.command.tokens import fill, pairs_of
from restart_harness.errors import UsageError, refused
from restart_harness.spec.keys import MAX_VALUE_CHARS, Key, coerce, keys_of
from restart_harness.spec.model_shape import load_model, preset_named, preset_names, shape_keys
from restart_harness.spec.runspec import RunSpec, run_keys

COMMANDS = ("run", "plan", "predict", "calibrate", "restart", "baseline", "report", "matrix", "mlperf", "clean",
            "study", "endure")


def unknown(name: str, value: str, accepted: list[str], engine: str | None = None) -> UsageError:
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
    values, pairs = fill(run_keys(), pairs_of(rest))
    if "launcher" in values:  # an alias (launcher=deepspeed) is recorded as the launcher's name
        values["launcher"] = resolve.launcher_class(values["launcher"]).name
    stack = resolve.stack_named(values.get("stack", run_keys()["stack"].default))
    values.setdefault("engine", stack.default_engine)  # each stack's own: DeepSpeed's torch.save, DCP for FSDP2
    engine = resolve.engine_class(values["engine"])
    options, pairs = fill(keys_of(engine.Options), pairs)
    shape_values, pairs = fill(shape_keys(), pairs)
    extra_values, pairs = fill(extra or {}, pairs)
    if pairs:
        name = next(iter(pairs))
        accepted = [*run_keys(), *shape_keys(), *keys_of(engine.Options), *(extra or {})]
        raise unknown(name, pairs[name], accepted, engine.name)
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
    kinds = resolve.kinds(spec)
    stack, engine, target = kinds.stack, kinds.engine, kinds.target
    kinds.launcher.check(spec)
    stack.check(spec, engine, target)
    if not stack.accepts_engine(engine):
        takers = [n for n, c in registry.all_engines().items() if stack.accepts_engine(c)]
        raise UsageError(f"engine={engine.name} does not checkpoint stack={spec.stack}; accepted with "
                         f"stack={spec.stack}: engine={', '.join(takers)}")
    where = f"ckpt_dir={spec.ckpt_dir}"
    if target.kind not in engine.target_kinds:
        takers = [n for n, c in registry.all_engines().items()
                  if target.kind in c.target_kinds and stack.accepts_engine(c)]
        raise UsageError(f"{where}: engine={engine.name} writes {_WRITES[engine.target_kinds[0]]}, not "
                         f"{_WRITES[target.kind]}; accepted with this ckpt_dir: engine={', '.join(takers)}")
    if spec.checksums == "on" and target.no_checksums:
        raise UsageError(f"checksums=on with {where}: {target.no_checksums}; accepted: checksums=auto|off, or a "
                         "ckpt_dir on a file system")


_WRITES = {"posix": "to a file system", "object": "to object storage"}


def is_sweep(tokens: list[str]) -> bool:
    """A comma list in MODEL or any value, or repeats > 1."""
    return any("," in t for t in tokens) or any(t.startswith("repeats=") and t.split("=", 1)[1] not in ("1", "+1")
                                                for t in tokens[1:])


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
