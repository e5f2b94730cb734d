"""Engine name -> Engine class, discovered from the modules of this package (helpers are named with a leading
underscore and not imported here). Importing an engine module imports no torch, so this runs
before any launch in a fraction of a second."""

from __future__ import annotations

from functools import cache

import engines
from engines.base import Engine
from restart_harness.errors import UsageError
from restart_harness.plugins import discover


@cache
def all_engines() -> dict[str, type[Engine]]:
    return discover(engines.__name__, engines.__path__, Engine, skip=("base", "registry"))


def names() -> list[str]:
    return list(all_engines())


def get(name: str) -> type[Engine]:
    try:
        return all_engines()[name]
    except KeyError:
        raise UsageError(f"engine={name}: unknown engine; accepted: {', '.join(names())}") from None


def owner_of_option(option: str) -> list[str]:
    """Engines that declare `option` (to tell a user which engine an option belongs to)."""
    from restart_harness.spec.keys import keys_of

    return [n for n, cls in all_engines().items() if option in keys_of(cls.Options)]
