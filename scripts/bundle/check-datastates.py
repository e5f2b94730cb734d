#!/usr/bin/env python3
"""Does a DataStates-LLM source tree provide the API DeepSpeed 0.19.8 calls? (scripts/bundle/gather.sh)

    scripts/bundle/check-datastates.py SRC_DIR [ENGINE_TYPE]

Read from the sources without importing them (building them needs CUDA): engines/_datastates_api.py says what is
needed (CheckpointEngine, save, wait(persist=True), a load that accepts DeepSpeed's callable map_location).
Prints the package folder and exits 0, or prints one line saying what is missing and exits 2.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not Path(argv[0]).is_dir():
        print("usage: scripts/bundle/check-datastates.py SRC_DIR [ENGINE_TYPE]", file=sys.stderr)
        return 2
    src = Path(argv[0])
    # engines/_datastates_api.py, loaded by its path: this script runs with any Python, the project not installed
    spec = importlib.util.spec_from_file_location("_datastates_api", ROOT / "engines" / "_datastates_api.py")
    api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api)
    try:
        found = api.check(src, *argv[1:])
    except ValueError as exc:
        print(f"{src}: {exc}", file=sys.stderr)
        return 2
    print(found.relative_to(src))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
