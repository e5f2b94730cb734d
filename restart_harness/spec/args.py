"""`MODEL key=value ...` -> RunSpec. Each bad token becomes one UsageError line naming it."""

from __future__ import annotations

import dataclasses
import re

from restart_harness.errors import UsageError
from restart_harness.spec import runspec
from restart_harness.spec.model_shape import FIELDS as SHAPE_FIELDS
from restart_harness.spec.model_shape import cast_field, load_model
from restart_harness.spec.runspec import RunSpec

# Keys the user may not set directly (filled by the parser or derived).
_INTERNAL = {"model", "shape", "model_source", "engine_options"}
CHOICES = {
    "precision": runspec.PRECISIONS,
    "cache": runspec.CACHE_MODES,
    "device": runspec.DEVICES,
    "launcher": runspec.LAUNCHERS,
    "phase": runspec.PHASES,
}
_TOKEN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_.,/:+@%=-]*$")


def run_keys() -> dict[str, str]:
    """Harness keys and their declared types ('int', 'int | None', ...)."""
    return {f.name: str(f.type) for f in dataclasses.fields(RunSpec) if f.name not in _INTERNAL}


def _convert(key: str, text: str, kind: str) -> object:
    if text == "" :
        raise UsageError(f"{key}=: empty value")
    if "None" in kind and text.lower() in ("none", "auto"):
        return None
    if kind.startswith("int"):
        if not re.fullmatch(r"[+-]?\d+", text):
            raise UsageError(f"{key}={text}: not an integer")
        return int(text)
    if kind.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"{key}={text}: not a number") from None
    if kind.startswith("bool"):
        return parse_bool(key, text)
    if not _SAFE_TEXT.match(text):
        raise UsageError(f"{key}={text}: contains characters outside [A-Za-z0-9_.,/:+@%=-]")
    if key in CHOICES and text not in CHOICES[key]:
        raise UsageError(f"{key}={text}: accepted values are {', '.join(CHOICES[key])}")
    return text


def parse_bool(key: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise UsageError(f"{key}={text}: accepted values are true, false")


def split_tokens(tokens: list[str]) -> tuple[str, dict[str, str]]:
    """First token is MODEL; the rest are key=value, each key at most once."""
    if not tokens:
        raise UsageError("missing MODEL; usage: ./submit-job.sh MODEL [key=value ...] (try: ./submit-job.sh tiny)")
    model, pairs = tokens[0], {}
    if "=" in model:
        raise UsageError(f"{model!r}: the first argument must be a MODEL (preset name or config.json path)")
    for token in tokens[1:]:
        match = _TOKEN.match(token)
        if not match:
            raise UsageError(f"{token!r}: malformed argument; expected key=value")
        key, value = match.groups()
        if key in pairs:
            raise UsageError(f"{key}: given twice ({key}={pairs[key]} and {token})")
        pairs[key] = value
    return model, pairs


def parse_args(tokens: list[str], check_engine: bool = True) -> RunSpec:
    """Build and validate the RunSpec for `MODEL key=value ...`; raises UsageError on the first problem.
    check_engine=False skips the engine's can-it-run-here check (the planner runs anywhere)."""
    from engines import registry  # engines own their names, options and availability

    model, pairs = split_tokens(tokens)
    shape, source = load_model(model)
    keys = run_keys()
    engine_name = pairs.get("engine", "default")
    engine = registry.get_spec(engine_name)
    values: dict[str, object] = {}
    shape_over: dict[str, object] = {}
    engine_options = dict(engine.defaults)
    for key, text in pairs.items():
        if key in keys:
            values[key] = _convert(key, text, keys[key])
        elif key in SHAPE_FIELDS:
            kind = str(SHAPE_FIELDS[key].type)
            shape_over[key] = cast_field(key, _convert(key, text, kind), "command line")
        elif key in engine.defaults:
            engine_options[key] = engine.convert_option(key, text)
        else:
            accepted = sorted(keys) + sorted(SHAPE_FIELDS)
            extra = f"; engine {engine_name} options: {', '.join(sorted(engine.defaults))}" if engine.defaults else ""
            raise UsageError(f"unknown key {key!r}; accepted: {', '.join(accepted)}{extra}")
    if shape_over:
        shape = dataclasses.replace(shape, **shape_over)
    spec = RunSpec(model=model, shape=shape, model_source=source, engine_options=engine_options, **values)
    spec.resolve()
    if check_engine:
        engine.check_runnable(spec)
    return spec
