"""Plug-in discovery: the subclasses of a base class defined in the modules of a package (one each; modules whose
names start with an underscore are helpers and are not read). Engines, training stacks and storage targets are
found this way, so adding one is adding its module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil


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
