"""`./submit-job.sh study`: the reference study's table, each cell (model, GPU count, strategy, engine) planned,
predicted and, where it fits here, run (docs/study.md)."""

from restart_harness.campaigns.study.campaign import check
from restart_harness.campaigns.study.running import main, run

__all__ = ["check", "main", "run"]
