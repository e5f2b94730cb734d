"""Engine name -> Engine class, discovered from the modules of this package (one engine per module; helpers are
named with a leading underscore and not imported here). Importing an engine module imports no torch, so this runs
before any launch in a fraction of a second."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from functools import cache

import engines
from engines.base import Engine
from restart_harness.errors import UsageError


@cache
def all_engines() -> dict[str, type[Engine]]:
    found: dict[str, type[Engine]] = {}
    for info in pkgutil.iter_modules(engines.__path__):
        if info.name.startswith("_") or info.name in ("base", "registry"):
            continue
        module = importlib.import_module(f"engines.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Engine) and cls is not Engine and cls.__module__ == module.__name__:
                if cls.name in found:
                    raise RuntimeError(f"engine name {cls.name!r} defined twice ({found[cls.name]} and {cls})")
                found[cls.name] = cls
    return dict(sorted(found.items()))


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
