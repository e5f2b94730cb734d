"""Resolving a run: the one place where the names a RunSpec holds (launcher=, stack= and emulate=, engine=,
ckpt_dir=) become the plug-ins that run it; a process resolves its run once and hands it on
(docs/architecture.md#one-resolved-run). Nothing else asks a registry for a plug-in by its name (tests/test_structure.py
counts the lookups)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from engines import registry
from engines.base import Engine
from restart_harness import launchers, stacks, targets
from restart_harness.launchers.base import Launcher, Scheduler
from restart_harness.spec import record as records
from restart_harness.spec.runspec import RunSpec
from restart_harness.stacks.base import Stack
from restart_harness.targets.base import Store, Stored, Target


# ---- the lookups by name: one per kind of plug-in --------------------------------------------------------------
def launcher_class(name: str) -> type[Launcher]:
    """launcher=NAME (a name or an alias); UsageError naming the accepted ones."""
    return launchers.get(name)


def stack_class(spec: RunSpec) -> type[Stack]:
    """The stack that runs spec's ranks: its stack=, or the emulated one with emulate=true."""
    return stacks.all_stacks()[stacks.EMULATED] if spec.emulate else stacks.get(spec.stack)


def stack_named(name: str) -> type[Stack]:
    """stack=NAME, before a spec exists (its default engine decides engine=)."""
    return stacks.get(name)


def engine_class(name: str) -> type[Engine]:
    """engine=NAME; UsageError naming the accepted ones."""
    return registry.get(name)


def target_class(location: str | None) -> type[Target]:
    """The storage target whose scheme ckpt_dir=location uses."""
    return targets.select(location)


def target_at(location: str | None, results_dir: str | Path = ".", key: str = "ckpt_dir") -> Target:
    """The storage target at ckpt_dir=location (or key=location: dir= of the baseline command), before any run."""
    return targets.for_location(location, results_dir, key)


@dataclass(frozen=True)
class Kinds:
    """The kinds of a spec's plug-ins, each looked up once: what the command line checks keys against (pure: no
    machine, no instance)."""

    launcher: type[Launcher]
    stack: type[Stack]
    engine: type[Engine]
    target: type[Target]


def kinds(spec: RunSpec) -> Kinds:
    return Kinds(launcher_class(spec.launcher), stack_class(spec), engine_class(spec.engine),
                 target_class(spec.ckpt_dir))


# ---- one spec's plug-ins -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plugins:
    """What runs one RunSpec, each plug-in looked up once; the target is where the run would put its checkpoints
    (placed when the run directory exists: Run)."""

    spec: RunSpec
    launcher: Launcher
    stack: type[Stack]
    engine: Engine
    target: Target
    scheduler: Scheduler | None = None  # the launcher's batch scheduler (job script, submission, state), if any

    def with_spec(self, spec: RunSpec) -> Plugins:
        """The same plug-ins' target with another spec (a campaign's runs: their results_dir, a cell's keys)."""
        return plugins(spec, target=self.target)


def plugins(spec: RunSpec, target: Target | None = None) -> Plugins:
    """The plug-ins of spec (target: one already placed, kept)."""
    if target is None:
        target = target_at(spec.ckpt_dir, spec.results_dir)
    launcher = launcher_class(spec.launcher)
    return Plugins(spec, launcher(spec), stack_class(spec), engine_class(spec.engine)(spec), target,
                   launcher.scheduler(spec) if launcher.scheduler else None)


# ---- one run, as made --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run(Plugins):
    """One resolved run: the spec, its plug-ins (the target placed), the run directory, and what spec.json records
    beside them (host and software facts; the restart record whose own spec this is)."""

    made: records.RunRecord | None = None
    stored: Stored | None = None  # the placed target's phase-side view: listing, deletion, caches, uploads

    def __post_init__(self):
        if self.stored is None:
            object.__setattr__(self, "stored", self.target.Stored(self.target))

    @property
    def run_dir(self) -> Path:
        return self.made.run_dir

    @property
    def facts(self) -> dict:
        return self.made.facts

    @property
    def record(self) -> str | None:
        """The restart record whose own spec this is (a restart at another layout), or None."""
        return self.made.record

    @property
    def checkpoint_root(self) -> Path:
        return self.made.checkpoint_root

    def store(self, observer) -> Store:
        """The placed target's rank-side view, reporting its network I/O to `observer` (a rank's anatomy)."""
        return self.stored.store(observer)

    def write(self) -> None:
        """spec.json: the record of this run."""
        self.made.write()

    def write_record_spec(self, record: str, spec: RunSpec) -> Path:
        """records/spec-<record>.json: this run at another layout, for one restart record."""
        return self.made.write_record_spec(record, spec)


def placed(resolved: Plugins, run_dir: Path, facts: dict, target: Target) -> Run:
    """The run whose directory was just made: preflight's plug-ins, the target placed there (recorded in spec.json)."""
    made = records.RunRecord(run_dir, resolved.spec, target.record(run_dir), facts)
    return Run(**{**vars(resolved), "target": target, "stored": None}, made=made)


def of_record(made: records.RunRecord, spec: RunSpec | None = None) -> Run:
    """The run spec.json describes, with its plug-ins (at `spec` instead: a restart's own, or completed in a job)."""
    made = made if spec is None else dataclasses.replace(made, spec=spec)
    cls = targets.recorded(made.target_record, made.run_dir)
    target = cls.from_record(made.target_record, made.checkpoint_root)
    return Run(**vars(plugins(made.spec, target=target)), made=made)


def read(run_dir: Path, record: str | None = None, spec: RunSpec | None = None) -> Run:
    """The run in run_dir (with the spec of `record` where that restart has its own, or `spec`: of_record); UsageError
    naming the problem when the folder is not a readable run directory."""
    return of_record(records.read(run_dir, record), spec=spec)
