"""Does a DataStates-LLM tree provide what DeepSpeed 0.19.8's DataStatesCheckpointEngine calls
(`from datastates import CheckpointEngine`, then save, wait(persist=True) and a load that calls a callable
map_location)? Read from the Python sources without importing them (that needs CUDA's libraries), with the standard
library only: by scripts/bundle/check-datastates.py when the bundle is gathered and by engine=datastates' node check
(docs/clusters.md#offline-install, docs/engines.md#enginedatastates-what-the-harness-does-that-deepspeed-does-not)."""

from __future__ import annotations

import ast
from pathlib import Path

SKIP = {".git", "build", "tests", "test"}
NEED = ("`from datastates import CheckpointEngine` with save, wait(persist=True) and a load that accepts a callable "
        "map_location, as DeepSpeed 0.19.8 calls them (DataStates-LLM 28d53c4 or later; the bundle's pin: "
        "scripts/bundle/datastates-llm.pin)")


def packages(src: Path) -> list[Path]:
    """Folders named datastates with an __init__.py (llm/datastates in newer sources, datastates in older)."""
    if src.name == "datastates" and (src / "__init__.py").is_file():  # an installed package given directly
        return [src]
    return sorted(p.parent for p in src.rglob("datastates/__init__.py") if not SKIP & set(p.relative_to(src).parts))


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return None


def _assigns(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)


def _binds(tree: ast.Module, name: str) -> bool:
    """Does the module bind `name`: define the class, import a name under it, or assign it?"""
    return any((isinstance(node, ast.ClassDef) and node.name == name) or _assigns(node, name)
               or (isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names))
               for node in ast.walk(tree))


def _registry(trees: list[ast.Module]) -> dict[str, str] | None:
    """The package's ENGINE_REGISTRY = {"type": Class, ...}, by class name, or None where it has none."""
    for node in (node for tree in trees for node in ast.walk(tree)):
        if _assigns(node, "ENGINE_REGISTRY") and isinstance(node.value, ast.Dict):
            return {k.value: v.id for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Name)}
    return None


def _methods(classes: dict[str, ast.ClassDef], name: str) -> dict[str, ast.FunctionDef]:
    """The methods of class `name` and of its base classes defined in the package (the subclass's first)."""
    out: dict[str, ast.FunctionDef] = {}
    todo, seen = [name], set()
    while todo:
        cls = classes.get(todo.pop(0))
        if cls is None or cls.name in seen:
            continue
        seen.add(cls.name)
        for f in cls.body:
            if isinstance(f, ast.FunctionDef):
                out.setdefault(f.name, f)
        todo += [b.id for b in cls.bases if isinstance(b, ast.Name)]
    return out


def check(src: Path, engine_type: str = "state_engine") -> Path:
    """The package (the folder `datastates`) DeepSpeed would use from the tree at `src`, or ValueError with one line
    (without the tree's path) saying what is missing and what is accepted."""
    candidates = packages(src)
    bound = [p for p in candidates if (t := _parse(p / "__init__.py")) is not None and _binds(t, "CheckpointEngine")]
    if not bound:
        where = ", ".join(str(p.relative_to(src)) for p in candidates) or "none"
        raise ValueError(f"no package `datastates` whose __init__.py binds CheckpointEngine (packages named "
                         f"datastates: {where}); DeepSpeed needs {NEED}")
    package = bound[0]
    trees = [tree for path in sorted(package.rglob("*.py")) if (tree := _parse(path)) is not None]
    classes, aliases = {}, {}
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.ClassDef):
            classes.setdefault(node.name, node)
        elif isinstance(node, ast.ImportFrom):
            aliases.update({a.asname: a.name for a in node.names if a.asname})
    registry = _registry(trees)
    rel = package.relative_to(src) if package != src else Path(package.name)
    if registry is not None:
        if engine_type not in registry:
            raise ValueError(f"{rel}: engine_type {engine_type!r} is not in its ENGINE_REGISTRY (it has: "
                             f"{', '.join(registry)}); accepted: sources whose registry has it ({NEED})")
        name = registry[engine_type]
    else:
        name = aliases.get("CheckpointEngine", "CheckpointEngine")
    methods = _methods(classes, name)
    if missing := [m for m in ("save", "load", "wait") if m not in methods]:
        raise ValueError(f"{rel} binds CheckpointEngine, but its engine class {name} has no {', '.join(missing)}; "
                         f"DeepSpeed needs {NEED}")
    arguments = {m: [a.arg for a in f.args.args + f.args.kwonlyargs] for m, f in methods.items()}
    if "persist" not in arguments["wait"]:
        raise ValueError(f"{rel} binds CheckpointEngine, but {name}.wait takes no `persist` (it would not say when "
                         f"a checkpoint is on storage); DeepSpeed needs {NEED}")
    calls = {n.func.id for n in ast.walk(methods["load"]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    if "map_location" not in arguments["load"] or "map_location" not in calls:  # called: a callable
        raise ValueError(f"{rel}: {name}.load does not accept a callable map_location (DeepSpeed 0.19.8 passes "
                         "`lambda storage, loc: storage`; sources before 28d53c4, such as ebc6762, hand it to "
                         f"Tensor.to and exit); DeepSpeed needs {NEED}")
    return package
