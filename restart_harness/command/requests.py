"""What the command line asks for, once parsed and validated (command/parse.py and the modules of each command):
the requests the campaigns and phases are handed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path as FsPath

from restart_harness import resolve
from restart_harness.command.options import MlperfOptions, PlanOptions, PredictOptions, StudyOptions
from restart_harness.spec.runspec import RunSpec


@dataclass
class PlanRequest:
    spec: RunSpec
    options: PlanOptions
    target: RunSpec | None = None  # plan a restart at this layout too (to_tp, to_pp, to_dp)


@dataclass
class PredictRequest:
    spec: RunSpec
    options: PredictOptions


@dataclass(frozen=True)
class RestartRequest:
    """An existing run resolved once, with the restart overrides applied, and how many restarts."""

    run: resolve.Run  # the run with the restarts' spec (completed on the node that launches them)
    original: RunSpec  # the run's spec as it was made (the layout that wrote the checkpoint)
    tokens: list[str]  # the overrides as given (key=value), handed on to a submitted restart-only job
    # what preflight's check of the committed checkpoint's content read, or None where its save recorded no checksums
    integrity: dict | None = None

    @property
    def run_dir(self) -> FsPath:
        return self.run.run_dir

    @property
    def spec(self) -> RunSpec:  # the restarts'
        return self.run.spec

    @property
    def relayout(self) -> bool:
        """The restart's layout differs from the one that wrote the checkpoint (tp, pp or dp)."""
        o = self.original
        return (self.spec.tp, self.spec.pp, self.spec.dp) != (o.tp, o.pp, o.dp)


@dataclass
class Combination:
    """One point of a sweep: the values that vary, the tokens that produce it, its validated RunSpec."""

    values: dict[str, str]
    tokens: list[str]
    spec: RunSpec
    plugins: resolve.Plugins | None = None  # once preflight has checked the combination


@dataclass
class SweepRequest:
    tokens: list[str]
    lists: dict[str, list[str]]
    combos: list[Combination]


@dataclass
class MlperfRequest:
    """An MLPerf Storage checkpoint workload as harness runs: the workload, its options, and the run spec every one
    of its runs uses (None: no workload given, the table of workloads)."""

    workload: object | None  # plan.mlperf.Workload
    options: MlperfOptions
    spec: RunSpec | None
    tokens: list[str]
    plugins: resolve.Plugins | None = None  # once preflight has checked the workload's runs


@dataclass(frozen=True)
class Strategy:
    """A parallel layout asked for by degrees: dp None fills each GPU count (tp x pp x dp = GPUs)."""

    tp: int
    pp: int
    dp: int | None
    text: str


@dataclass
class StudyRequest:
    """`study [key=value ...]`: what the study covers and the run keys every cell takes (campaigns/study/)."""

    options: StudyOptions
    predict: PredictOptions  # the storage and CPUs predictions assume (write_gbps=, read_gbps=, ...)
    run_tokens: list[str]  # run keys (key=value) every cell's run takes
    models: list[str]
    gpu_counts: list[int]
    engines: list[str]
    strategies: list[Strategy] | None  # None: auto
    tokens: list[str]  # the command's words, recorded in study.json (resume= runs them again)
