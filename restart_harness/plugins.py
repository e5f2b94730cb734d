"""What every plug-in shares: how it is found (the subclasses of a base class defined in the modules of a package, one
each; modules whose names start with an underscore are helpers and are not read), so that adding an engine, a
launcher, a training stack or a storage target is adding its module; and how it says what it needs of the node that
runs the ranks (NodeCheck)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeCheck:
    """One thing the node that runs the ranks must have (an engine's module or op, CUDA and its GPUs): checked where
    the ranks start, before the launcher starts them (restart_harness/nodecheck.py)."""

    name: str  # what it is about: "engine=datastates", "device=cuda"
    what: str  # what it checks, one line (dry_run=true prints it)
    run: Callable[[], str | None]  # why this node cannot run the ranks, or None
    instead: str = ""  # what to ask for instead, where the ranks would start on the machine the command is typed on


def discover(package: str, path, base: type, skip: tuple[str, ...] = ("base",)) -> dict[str, type]:
    """name -> class for every subclass of `base` defined in a module of `package` (at `path`), sorted by name."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(path):
        if info.name.startswith("_") or info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, base) and cls is not base and cls.__module__ == module.__name__:
                if cls.name in found:
                    raise RuntimeError(f"{base.__name__} {cls.name!r} defined twice ({found[cls.name]} and {cls})")
                found[cls.name] = cls
    return dict(sorted(found.items()))
