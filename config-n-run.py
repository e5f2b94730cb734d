#!/usr/bin/env python3
"""Entry point: validate `MODEL key=value ...`, generate the DeepSpeed config and launch scripts, run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from restart_harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
