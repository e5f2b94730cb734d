"""key=value words -> values, the one way for every command: each key at most once, each value coerced by its
declaration (spec/keys.py), unknown and missing keys refused in one line naming what is accepted."""

from __future__ import annotations

import re

from restart_harness.errors import UsageError
from restart_harness.spec.keys import Key, coerce, keys_of

TOKEN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def pairs_of(tokens: list[str]) -> dict[str, str]:
    """key=value tokens -> {key: text}; each key at most once."""
    pairs: dict[str, str] = {}
    for token in tokens:
        match = TOKEN.match(token)
        if not match:
            raise UsageError(f"{token!r}: malformed argument; expected key=value")
        name, value = match.groups()
        if name in pairs:
            raise UsageError(f"{name}: given twice ({name}={pairs[name]} and {token})")
        pairs[name] = value
    return pairs


def fill(declared: dict[str, Key], pairs: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """(the pairs declared in `declared`, coerced; the pairs left over)."""
    values = {name: coerce(declared[name], text) for name, text in pairs.items() if name in declared}
    return values, {name: text for name, text in pairs.items() if name not in declared}


def required(declared: dict[str, Key], values: dict, command: str) -> None:
    for name, k in declared.items():
        if k.required and name not in values:
            raise UsageError(f"{command} needs {name}=: {k.help}")


def options_of(cls: type, tokens: list[str], command: str):
    """A command's own options (a dataclass of key() fields) from its tokens: unknown keys and missing required
    ones refused with one line naming what the command accepts."""
    declared = keys_of(cls)
    values, rest = fill(declared, pairs_of(tokens))
    if rest:
        name = next(iter(rest))
        raise UsageError(f"{name}={rest[name]}: not a {command} key; {command} accepts "
                         f"{', '.join(f'{k}=' for k in declared)}")
    required(declared, values, command)
    return cls(**values)
