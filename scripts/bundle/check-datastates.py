#!/usr/bin/env python3
"""Does a DataStates-LLM source tree provide the API DeepSpeed 0.19.8 imports? (scripts/bundle/gather.sh)

    scripts/bundle/check-datastates.py SRC_DIR

DeepSpeed 0.19.8's DataStatesCheckpointEngine does `from datastates import CheckpointEngine` and calls
CheckpointEngine(config, rank), save(state_dict, path), load(path, map_location) and wait(persist=True). Read from
the sources without importing them (building them needs CUDA): a package folder `datastates` whose __init__.py binds
the name CheckpointEngine, and a class in that package with save, load and a wait taking `persist`. Prints the
package folder and exits 0, or prints one line saying what is missing and exits 2.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SKIP = {".git", "build", "tests", "test"}


def packages(src: Path) -> list[Path]:
    """Folders named datastates with an __init__.py (llm/datastates in newer sources, datastates in older)."""
    return sorted(p.parent for p in src.rglob("datastates/__init__.py") if not SKIP & set(p.relative_to(src).parts))


def binds_checkpoint_engine(init: Path) -> bool:
    for node in ast.walk(ast.parse(init.read_text(errors="replace"))):
        if isinstance(node, ast.ClassDef) and node.name == "CheckpointEngine":
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "CheckpointEngine" for a in node.names):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CheckpointEngine"
                                                for t in node.targets):
            return True
    return False


def engine_classes(package: Path) -> list[str]:
    """Classes in the package with save, load and a wait that takes `persist`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
            wait = methods.get("wait")
            if wait is None or not {"save", "load"} <= methods.keys():
                continue
            if "persist" in [a.arg for a in wait.args.args + wait.args.kwonlyargs]:
                found.append(f"{path.relative_to(package)}:{cls.name}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: scripts/bundle/check-datastates.py SRC_DIR", file=sys.stderr)
        return 2
    src = Path(argv[0])
    need = "`from datastates import CheckpointEngine` with save, load and wait(persist=True), as DeepSpeed 0.19.8 uses"
    candidates = packages(src)
    bound = [p for p in candidates if binds_checkpoint_engine(p / "__init__.py")]
    if not bound:
        where = ", ".join(str(p.relative_to(src)) for p in candidates) or "none"
        print(f"{src}: no package `datastates` whose __init__.py binds CheckpointEngine (packages named datastates: "
              f"{where}); DeepSpeed needs {need}", file=sys.stderr)
        return 2
    package = bound[0]
    if not engine_classes(package):
        print(f"{src}: {package.relative_to(src)} binds CheckpointEngine, but no class in it has save, load and a "
              f"wait taking `persist`; DeepSpeed needs {need}", file=sys.stderr)
        return 2
    print(package.relative_to(src))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
