"""`study [key=value ...]`: the models, GPU counts, engines and strategies a study covers, and the run keys every
cell takes (campaigns/study/); resume=DIR reads them back from the study's own study.json."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path as FsPath

from engines import registry
from restart_harness import resolve, stacks
from restart_harness.command.options import STUDY_FIXED, PredictOptions, StudyOptions
from restart_harness.command.requests import Strategy, StudyRequest
from restart_harness.command.run import unknown
from restart_harness.command.tokens import fill, pairs_of
from restart_harness.errors import UsageError
from restart_harness.schema import STUDY
from restart_harness.spec.keys import coerce, keys_of
from restart_harness.spec.model_shape import load_model, preset_names, shape_keys
from restart_harness.spec.runspec import MAX_WORLD, plausible_rates, run_keys

_DEGREE = r"(tp[1-9][0-9]*|pp[1-9][0-9]*|dp(?:[1-9][0-9]*)?)"
_STRATEGY = re.compile(rf"^{_DEGREE}(-{_DEGREE})*$")


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
        raise UsageError(f"{fixed[0]}={pairs[fixed[0]]}: set by the study for each cell (its layout, engine and "
                         "option: a real run, emulation, shrunk, predicted); accepted: the study keys "
                         "(./submit-job.sh study --help) and the other run keys")
    values, rest = fill(keys_of(StudyOptions), pairs)
    predict_values, rest = fill({k: v for k, v in keys_of(PredictOptions).items() if k != "predict"}, rest)
    declared = run_keys()
    for name, text in rest.items():
        if name not in declared:
            raise unknown(name, text, [*keys_of(StudyOptions), *keys_of(PredictOptions), *declared])
        coerce(declared[name], text)
    options = StudyOptions(**values)
    predict = PredictOptions(**predict_values)
    if (predict.write_gbps is None) != (predict.read_gbps is None):
        given = "write_gbps" if predict.write_gbps is not None else "read_gbps"
        raise UsageError(f"{given}={pairs[given]}: give write_gbps= and read_gbps= together (or neither: the cached "
                         "baseline)")
    models, gpus = _models(options, predict), _study_list("gpus", options.gpus, "GPU counts")
    for text in gpus:
        if not (text.isascii() and text.isdigit()) or int(text) < 1 or int(text) > MAX_WORLD:
            raise UsageError(f"gpus={options.gpus}: {text!r} is not a GPU count; accepted: positive integers up to "
                             f"{MAX_WORLD:,}, comma-separated, e.g. gpus=8,16")
    engines = _study_engines(options.engines, resolve.stack_named(declared["stack"].default))  # stack= is fixed
    strategies = (None if options.strategies == "auto" else
                  [parse_strategy(t) for t in _study_list("strategies", options.strategies, "strategies")])
    pairs_run = {**rest, "keep": rest.get("keep", "false")}  # each cell's checkpoint deleted once its records are
    return StudyRequest(options, predict, [f"{k}={v}" for k, v in pairs_run.items()], models, [int(t) for t in gpus],
                        engines, strategies, list(tokens))


def _models(options: StudyOptions, predict: PredictOptions) -> list[str]:
    models = _study_list("models", options.models, "model presets")
    for model in models:
        try:
            shape = load_model(model)[0]
        except UsageError as exc:
            raise UsageError(f"models={options.models}: {exc}" if "/" in model or model.endswith((".yaml", ".json"))
                             else f"models={options.models}: unknown model {model!r}; accepted: "
                                  f"{', '.join(preset_names())}, a .yaml preset or an HF config.json") from None
        plausible_rates(shape, 1, dataclasses.asdict(predict))
    return models


def _study_engines(text: str, stack: type[stacks.Stack]) -> list[str]:
    """engines=: the engines named (+NAME,...: the key's default, the reference study's, then these), each one that
    saves a checkpoint of the stack the cells run."""
    every = registry.all_engines()
    engines = keys_of(StudyOptions)["engines"].default.split(",") if text.startswith("+") else []
    saving = ", ".join(n for n, c in every.items() if c.saves)
    for name in _study_list("engines", text.removeprefix("+"), "engine names"):
        if name not in every:
            raise UsageError(f"engines={text}: unknown engine {name!r}; accepted: {saving}")
        cls = resolve.engine_class(name)
        if not cls.saves:
            raise UsageError(f"engines={text}: engine {name} writes no checkpoint; accepted: {saving}")
        if not stack.accepts_engine(cls):
            raise UsageError(f"engines={text}: engine {name} does not checkpoint {stack.key_text}; accepted: "
                             + ", ".join(n for n, c in every.items() if c.saves and stack.accepts_engine(c)))
        if name not in engines:
            engines.append(name)
    return engines


def _resumed(pairs: dict[str, str]) -> dict[str, str]:
    """resume=DIR: the words the study was started with (its study.json), and a new time_limit= if given."""
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
    resumed = pairs_of([w for w in words if not w.startswith(("resume=", "time_limit="))])
    return {**resumed, "resume": pairs["resume"], **({"time_limit": pairs["time_limit"]} if "time_limit" in pairs
                                                      else {})}
