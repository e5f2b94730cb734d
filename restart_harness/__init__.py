"""restart-harness: measure what DeepSpeed checkpointing and restarting really cost."""

from pathlib import Path

__version__ = "0.5.0"

# The folder holding this package (the checkout, for an editable install): generated scripts cd here so that
# `python -m restart_harness...` finds the package whichever Python runs it.
SOURCE_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = SOURCE_ROOT / "configs"
