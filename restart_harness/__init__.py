"""restart-harness: measure what DeepSpeed checkpointing and restarting really cost."""

from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
SCHEMA_VERSION = 1
