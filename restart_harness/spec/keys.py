"""Every key of every command is declared once, as a dataclass field made with key(): its type (the annotation),
default, unit, help, accepted values, range, --help group, and whether a sweep list or a restart may set it. coerce()
is the one way text becomes a value, check() the one way a value of any origin is checked (docs/keys.md: the keys)."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from functools import cache

from restart_harness.errors import UsageError
from restart_harness.files.fsfacts import why_too_long

GROUPS = ("model", "layout", "training", "checkpoint", "observe", "launch", "cluster", "output", "plan", "predict",
          "calibrate", "baseline", "matrix", "report", "restart", "mlperf", "clean", "study", "environment",
          "endure", "goodput")
# Text values never pass through a shell unquoted; this keeps them free of shell and JSON surprises as well.
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_.,/:+@%=~-]*$")
_SAFE_GLOB = re.compile(r"^[A-Za-z0-9_.,/:+@%=~*?\[\]!-]*$")
_INT = re.compile(r"^[+-]?[0-9]+$")  # ASCII digits only: "２" is not 2
_SIZE = re.compile(r"^([0-9]+)(?:([kmgt])(i?)(b?))?$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}
GB, GIB = 10**9, 1 << 30
UNITS = ("GB = 10^9 bytes, GiB = 2^30 bytes (K, M, T alike); a letter alone is binary: 64M = 64 MiB; "
         "GB/s = 10^9 bytes/s")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
BOOL_WORDS = f"true, false (also {', '.join(w for pair in zip(TRUE[1:], FALSE[1:]) for w in pair)})"
SIZE_EXAMPLES = "4096, 64M or 64MiB = 64 x 2^20, 10GB = 10 x 10^9"
_SECONDS = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$", re.IGNORECASE)
_SECONDS_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
SECONDS_EXAMPLES = "seconds, or a number with s, m, h or d: 90, 90s, 10m, 2h, 3d"
# Every number a user gives is bounded: an integer or size key without a maximum of its own takes one of these
INT_MAX = 2**31 - 1
SIZE_MAX = 1 << 50  # 1 PiB
MAX_VALUE_CHARS = 1024  # a value longer than this is refused by its length, never echoed whole
# What the keys lead to is bounded too (issue 68): a time a rate predicts at most a year, a checkpoint SIZE_MAX
SECONDS_MAX = 366 * 86400


def plausible_rate(name: str, value: float, work: float, what: str, scale: float = 1.0) -> None:
    """`name=value` (a rate of `scale` units of work a second) does `work` (`what`) within SECONDS_MAX, or is refused
    naming the time it would take and the smallest rate that keeps it within the bound."""
    seconds = work / (value * scale)
    if seconds > SECONDS_MAX:
        raise UsageError(f"{name}={value:g}: {what} would take {seconds:.3g} s ({seconds / SECONDS_MAX:.3g} years) "
                         f"at this rate; accepted: {name} >= {work / SECONDS_MAX / scale:.3g} (at most a year)")


class Size(int):
    """A byte count; on the command line 4096, 64K or 64KiB (2^10), 64MB (10^6), 10GB (10^9), 1G or 1GiB (2^30)."""


class Seconds(float):
    """A time in seconds; on the command line 90, 90s, 10m, 2h or 3d."""


class Path(str):
    """Text naming a file or folder (checked against the machine in preflight, never here)."""


class Glob(str):
    """A shell-style pattern (fnmatch): safe text and * ? [ ] !."""


@dataclass(frozen=True)
class Key:
    """One declared key."""

    name: str
    type: type  # int, float, bool, str, Path or Size
    optional: bool  # None is a value (`none` / `auto` on the command line)
    default: object
    help: str
    group: str
    unit: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # inclusive
    above: float | None = None  # exclusive
    maximum: float | None = None  # inclusive
    sweep: bool = True  # may take a comma list (one run per value)
    restart: bool = False  # a restart-only re-run may set it
    required: bool = False
    config: bool = True  # runs that differ in it are different configurations (key())

    @property
    def upper(self) -> float | None:
        """The largest value accepted: the declared maximum, else the bound every integer and size has."""
        return self.maximum if self.maximum is not None else {int: INT_MAX, Size: SIZE_MAX}.get(self.type)

    @property
    def type_name(self) -> str:
        name = {int: "int", float: "float", bool: "bool", str: "text", Path: "path", Size: "bytes",
                Glob: "glob", Seconds: "time"}[self.type]
        return name + (" | none" if self.optional else "")

    @property
    def default_text(self) -> object:
        """The default as --help and docs/keys.md write it (a model's shape key: from MODEL)."""
        if self.required:
            return "from MODEL" if self.group == "model" else "required"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        return "none" if self.default is None else self.default

    def accepted(self) -> str:
        """What the key accepts, in words (for error lines and --help)."""
        if self.choices:
            return ", ".join(self.choices)
        if self.type is bool:
            return BOOL_WORDS
        words = {int: "an integer", float: "a finite number", Size: f"a size in bytes ({SIZE_EXAMPLES})",
                 Seconds: f"a time ({SECONDS_EXAMPLES})",
                 str: "text of [A-Za-z0-9_.,/:+@%=~-]", Path: "a path of [A-Za-z0-9_.,/:+@%=~-]",
                 Glob: "a pattern of [A-Za-z0-9_.,/:+@%=~-] and * ? [ ] !"}[self.type]
        upper = self.upper
        if self.minimum is not None and upper is not None:
            words += f" from {_number(self.minimum)} to {_number(upper)}"
        elif self.minimum is not None:
            words += f" >= {_number(self.minimum)}"
        elif upper is not None:
            words += f" <= {_number(upper)}"
        if self.above is not None:
            words += f" > {self.above:g}"
        return words + (" or none" if self.optional else "")


def _number(x: float) -> str:
    """A bound as people read it: 2,147,483,647, 0.5."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def key(default: object, help: str, *, group: str, unit: str | None = None, choices: tuple[str, ...] | None = None,
        minimum: float | None = None, above: float | None = None, maximum: float | None = None, sweep: bool = True,
        restart: bool = False, required: bool = False, config: bool = True) -> dataclasses.Field:
    """A dataclass field that is also a declared key; config=False: two runs that differ only in it are repeats of
    one configuration (a seed, a path, a port, a timeout: results/ and analysis/ pool them)."""
    if group not in GROUPS:
        raise ValueError(f"unknown key group {group!r}")
    meta = {"key": {"help": help, "group": group, "unit": unit, "choices": choices, "minimum": minimum, "above": above,
                    "maximum": maximum, "sweep": sweep, "restart": restart, "config": config,
                    "required": required or default is dataclasses.MISSING}}
    return dataclasses.field(default=default, metadata=meta)


@cache
def keys_of(cls: type) -> dict[str, Key]:
    """name -> Key for the fields of cls declared with key(), in declaration order."""
    hints = typing.get_type_hints(cls)  # a module using Path or Size imports them from here
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("key")
        if meta is None:
            continue
        args = typing.get_args(hints[f.name])  # `X | None`: X, and None is a value
        optional = type(None) in args
        kind = next(a for a in args if a is not type(None)) if optional else hints[f.name]
        out[f.name] = Key(name=f.name, type=kind, optional=optional, default=f.default, **meta)
    return out


def parse_bool(name: str, text: str) -> bool:
    if text.lower() in (*TRUE, *FALSE):
        return text.lower() in TRUE
    raise UsageError(f"{name}={text}: accepted values are {BOOL_WORDS}")


def parse_size(name: str, text: str) -> int:
    """Bytes of `4096`, `64M`/`64MiB` (2^20) or `64MB` (10^6): UNITS."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"{name}={text}: expected a size in bytes ({SIZE_EXAMPLES})")
    digits, letter, binary, byte = match.groups()
    if not letter:
        return int(digits)
    base = 1000 if byte and not binary else 1024
    return int(digits) * base ** _POWERS[letter.lower()]


def parse_seconds(name: str, text: str) -> float:
    """Seconds of `90`, `90s`, `10m`, `2h` or `3d`."""
    match = _SECONDS.match(text)
    if not match:
        raise UsageError(f"{name}={text}: not a time; accepted: {SECONDS_EXAMPLES}")
    return float(match.group(1)) * _SECONDS_UNIT[match.group(2).lower()]


def coerce(k: Key, text: str) -> object:
    """Command-line text -> the key's value, checked; raises UsageError naming `name=text` and what is accepted."""
    if text == "":
        raise UsageError(f"{k.name}=: empty value; accepted: {k.accepted()}")
    if len(text) > MAX_VALUE_CHARS:
        raise UsageError(f"{k.name}=: a value of {len(text):,} characters; accepted: at most {MAX_VALUE_CHARS:,}")
    if not text.isascii():
        raise UsageError(f"{k.name}={text}: contains characters outside ASCII; accepted: {k.accepted()}")
    if k.optional and text.lower() in ("none", "auto"):
        return None
    if k.type is bool:
        value: object = parse_bool(k.name, text)
    elif k.type is int:
        if not _INT.match(text):
            raise UsageError(f"{k.name}={text}: not an integer")
        value = int(text)
    elif k.type is Size:
        value = parse_size(k.name, text)
    elif k.type is Seconds:
        value = parse_seconds(k.name, text)
    elif k.type is float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{k.name}={text}: not a number") from None
    else:
        if not (_SAFE_GLOB if k.type is Glob else _SAFE_TEXT).match(text):
            glob = " and * ? [ ] !" if k.type is Glob else ""
            raise UsageError(f"{k.name}={text}: contains characters outside [A-Za-z0-9_.,/:+@%=~-]{glob}")
        if k.type is Path and "://" not in text and (why := why_too_long(text)):  # an object store's own rules
            raise UsageError(f"{k.name}={text}: {why}")
        value = text
    return check(k, value, text)


def check(k: Key, value: object, text: str | None = None) -> object:
    """A value of any origin (command line, YAML preset, spec.json) against the key's declaration."""
    shown = f"{k.name}={value if text is None else text}"
    if value is None:
        if k.optional:
            return None
        raise UsageError(f"{k.name}: a value is required; accepted: {k.accepted()}")
    if k.type is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{shown}: accepted values are true, false")  # a YAML or JSON value, not text
        return value
    if k.type in (int, Size):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{shown}: must be an integer")
        value = int(value)
    elif k.type in (float, Seconds):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{shown}: must be a number")
        value = float(value)
        if not math.isfinite(value):
            raise UsageError(f"{shown}: must be a finite number")
    elif not isinstance(value, str):
        raise UsageError(f"{shown}: must be text")
    if k.choices and value not in k.choices:
        raise UsageError(f"{shown}: accepted values are {', '.join(k.choices)}")
    if k.minimum is not None and value < k.minimum:
        what = "a positive integer" if k.type in (int, Size) and k.minimum == 1 else f">= {k.minimum:g}"
        raise UsageError(f"{shown}: must be {what}")
    if k.above is not None and value <= k.above:
        what = "a positive number" if k.above == 0 else f"> {k.above:g}"
        raise UsageError(f"{shown}: must be {what}")
    if k.upper is not None and value > k.upper:
        raise UsageError(f"{shown}: must be at most {_number(k.upper)}")
    return value


def describe(k: Key) -> str:
    """One --help line: name=<type> (default), unit, meaning, accepted values."""
    unit = f" [{k.unit}]" if k.unit else ""
    choices = f" ({' | '.join(k.choices)})" if k.choices else ""
    return f"{k.name}={k.type_name}{choices}  default {k.default_text}{unit}: {k.help}"
