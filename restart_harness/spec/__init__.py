"""Arguments -> validated RunSpec. Nothing here imports torch or DeepSpeed."""

from restart_harness.spec.args import parse_args
from restart_harness.spec.runspec import RunSpec

__all__ = ["RunSpec", "parse_args"]
