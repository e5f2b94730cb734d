"""`./submit-job.sh study [models=3B,13B,70B] [gpus=8,16] [engines=...] [strategies=auto] [time_limit=25] ...`: the
reference study's table - for each model, each parallel strategy a GPU count allows and each engine, the checkpoint's
files and their sizes, the save and the restart - with every figure saying where it comes from (docs/study.md).

A cell is one (model, GPU count, strategy, engine). Every cell is planned (the planner's files, exact) and predicted
at its real size (the calibrated model, for the device). Cells whose engine runs here are then run, each as the most
faithful option that fits the disk and its share of the time: a real run, emulation at real size (the real files
written and read without training), or shrunk (shrink=K: the same file names and counts, smaller tensors; its
measurement checks the predictor at that size); the rest stay planned and predicted, with the reason. Each run is an
ordinary run folder inside the study's folder; study.json records the cells and is rewritten after each, so that
`resume=DIR` continues an interrupted study. analysis/study.py turns it into the table (CSV, Markdown, a report
section and plots).
"""

from restart_harness.campaigns.study.campaign import check
from restart_harness.campaigns.study.running import main, run

__all__ = ["check", "main", "run"]
