"""The prediction model (docs/prediction.md): each phase of a save and of a restart is a sum of terms, each term a
fitted non-negative rate times a feature of the run (features.py) that a resource bounds:

    phase_seconds = sum_k  coefficient[phase, group, k] x term_k(features)

The coefficients come from a calibration (fit.py: finished runs of this machine class), per group: the save and
load phases per stack and engine, the launch per launcher, the other restart phases per stack. The range of a
phase is its prediction times the 10th and 90th percentiles of measured / fitted over the calibration's runs.
restart_total_with_launch_seconds is the sum of the restart's phases (and of their lows and highs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from restart_harness.predict.features import Features
from restart_harness.resolve import Plugins
from restart_harness.results.prediction import RESTART_PHASES, SAVE_PHASES, TOTAL
from restart_harness.spec.runspec import run_keys


@dataclass(frozen=True)
class Term:
    name: str
    resource: str  # what bounds the phase when this term dominates
    unit: str  # of the coefficient
    value: Callable[[Features], float | None]  # None: the feature is unknown (no bandwidth)


def _per(n: float | None, d: float | None) -> float | None:
    return None if n is None or not d else n / d


FIXED = Term("fixed", "fixed costs (the phase says which)", "s", lambda f: 1.0)
STORAGE_WRITE = Term("storage_write", "storage bandwidth", "x (bytes / aggregate write bandwidth)",
                     lambda f: _per(f.save_bytes_at_once, f.write_bytes_per_s))
SERIALIZE = Term("serialize", "host CPU: serialization and copies",
                 "s per byte of the last rank to finish, at one core's pace (ranks still saving share the cores)",
                 lambda f: f.save_core_bytes)
# ranks crowding shared cores slow each other more than their share of the cores (threads of their own, caches,
# memory bandwidth): measured 2026-11-28, torchsnapshot's serialization per byte grew with contention squared
CROWDED = "host CPU: ranks crowding the shared cores (their threads, caches, memory bandwidth)"
SERIALIZE_CROWDED = Term("serialize_crowded", CROWDED, "s per byte of the last rank to finish x contention",
                         lambda f: f.save_core_bytes * f.io_contention)
FILES = Term("files", "storage metadata and requests", "s per file of the busiest rank",
             lambda f: f.save_files_max_rank)
STORAGE_READ = Term("storage_read", "storage bandwidth", "x (bytes / aggregate read bandwidth)",
                    lambda f: _per(f.read_bytes_at_once, f.read_bytes_per_s) if f.cold_reads else 0.0)
METADATA_WRITE = Term("metadata_write", "storage metadata rate (creates or PUT requests per second)",
                      "x (files / the storage's stated operations per second)",
                      lambda f: _per(f.save_files, f.metadata_ops_per_s) or 0.0)
METADATA_READ = Term("metadata_read", "storage metadata rate (opens or GET requests per second)",
                     "x (file opens / the storage's stated operations per second)",
                     lambda f: _per(f.read_files, f.metadata_ops_per_s) or 0.0)
DESERIALIZE = Term("deserialize", "host CPU: deserialization and copies",
                   "s per byte the last rank to finish reads, at one core's pace (ranks still loading share the cores)",
                   lambda f: f.read_core_bytes)
READ_FILES = Term("read_files", "storage metadata and requests", "s per file the busiest rank reads",
                  lambda f: f.read_files_max_rank)
SPAWN = Term("spawn", "launcher: processes started per node", "s per rank on a node", lambda f: f.ranks_per_node)
CPU = Term("cpu", "host CPU: ranks sharing cores", "s x contention", lambda f: f.contention)
# a save's or a load's share of the cores: that of the ranks saving or loading at once (an emulated wave's)
IO_CPU = Term("cpu", CPU.resource, CPU.unit, lambda f: f.io_contention)
RANKS_SHARING = Term("ranks_sharing", "host CPU: every rank's collectives on shared cores", "s per rank x contention^2",
                     lambda f: f.io_world_size * f.io_contention ** 2)
WORLD = Term("world", "network: rendezvous of every rank", "s per rank", lambda f: f.world_size)
PARAMETERS = Term("parameters", "allocating and initialising the rank's model and optimizer",
                  "s per parameter of a rank x contention", lambda f: f.parameters_per_rank * f.contention)
COMPUTE = Term("compute", "compute: one training step",
               "s per parameter x token of a rank x contention",
               lambda f: f.parameters_per_rank * f.tokens_per_rank_step * f.contention)


def _storm(phase: str) -> Term:
    """Every rank's metadata operations of a start-up phase over the environment's file system's rate: what an
    import storm costs when the ranks start together (0 where the rate is not stated)."""
    def value(f: Features) -> float:
        ops = (f.startup_metadata_ops_per_rank or {}).get(phase)
        return _per(f.world_size * ops, f.env_metadata_ops_per_s) or 0.0 if ops else 0.0

    return Term("environment_metadata", "the environment's file system: every rank's metadata operations "
                "(an import storm)", "x (ranks x operations a rank / the file system's operations per second)", value)


EXTRAPOLATION = 2.0  # a term's value beyond this many times the largest the calibration saw is flagged


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]
    group: Callable[[Plugins], str]  # whose coefficients: a phase is fitted per group
    fixed: str  # what the fixed term stands for in this phase
    given: tuple[str, ...] = ()  # terms not fitted: coefficient 1 (the storage's own time at its baseline)
    given_if_synchronous: tuple[str, ...] = ()  # the same where every calibration run of the group saved synchronously


def _engine(plugins: Plugins) -> str:
    return f"{plugins.stack.name}/{plugins.spec.engine}"


def _stack(plugins: Plugins) -> str:
    return plugins.stack.name  # emulate=true: the emulated stack


def _stack_device(plugins: Plugins) -> str:
    """Compute on the device: a calibration of CPU ranks says nothing of a GPU's model build or step."""
    return f"{plugins.stack.name}/{plugins.spec.device}"


def _launcher(plugins: Plugins) -> str:
    return plugins.launcher.name


_SAVE = (FIXED, IO_CPU, STORAGE_WRITE, METADATA_WRITE, SERIALIZE, SERIALIZE_CROWDED, FILES, RANKS_SHARING)
_SAVE_FIXED = "fixed per save: barriers, collectives, the engine's bookkeeping"
PHASES: dict[str, Phase] = {p.name: p for p in (
    # an asynchronous save's blocking part writes nothing; a synchronous one writes everything before it returns
    Phase("save_blocking_seconds", _SAVE, _engine, _SAVE_FIXED,
          given_if_synchronous=("storage_write", "metadata_write")),
    Phase("save_durable_seconds", _SAVE, _engine, _SAVE_FIXED, given=("storage_write", "metadata_write")),
    Phase("save_commit_seconds", _SAVE, _engine, _SAVE_FIXED, given=("storage_write", "metadata_write")),
    Phase("restart_launch_seconds", (FIXED, SPAWN), _launcher, "launcher: its own start-up"),
    Phase("restart_imports_seconds", (FIXED, CPU, _storm("imports")), _stack, "host CPU: Python imports",
          given=("environment_metadata",)),
    Phase("restart_dist_init_seconds", (FIXED, WORLD, _storm("dist_init")), _stack, "network: process-group set-up",
          given=("environment_metadata",)),
    Phase("restart_model_build_seconds", (FIXED, PARAMETERS, _storm("model_build")), _stack_device,
          "building the model", given=("environment_metadata",)),
    Phase("restart_engine_init_seconds", (FIXED, CPU, PARAMETERS, _storm("engine_init")), _stack_device,
          "the engine's set-up", given=("environment_metadata",)),
    Phase("restart_checkpoint_load_seconds", (FIXED, IO_CPU, STORAGE_READ, METADATA_READ, DESERIALIZE, READ_FILES,
                                              RANKS_SHARING),
          _engine, "fixed per load: finding the tag, collectives, the engine's bookkeeping",
          given=("storage_read", "metadata_read")),
    Phase("restart_first_step_seconds", (FIXED, COMPUTE), _stack_device, "a step's fixed part"))}
assert tuple(PHASES) == (*SAVE_PHASES, *RESTART_PHASES)


def fallback_group(phase: Phase, plugins: Plugins) -> str | None:
    """Where an engine was not calibrated: the same stack's default engine; a launcher: the default launcher's (said in
    the prediction's note)."""
    if phase.group is _engine:
        return f"{plugins.stack.name}/default"
    if phase.group is _launcher:
        return run_keys()["launcher"].default  # the default launcher's name: its calibration key
    return None


def predict_phase(phase: Phase, features: Features, fitted: dict) -> dict:
    """One phase from its group's fitted coefficients: seconds, range, the bounding resource and each term's part."""
    parts, beyond = {}, []
    for term in phase.terms:
        c = 1.0 if term.name in phase.given else fitted["coefficients"].get(term.name, 0.0)
        if c == 0.0:
            continue
        x = term.value(features)
        if x is None:
            return {"seconds": None, "why": f"{term.name} needs the storage's bandwidth (a baseline or write_gbps= "
                                            "and read_gbps=)"}
        parts[term.name] = c * x
        seen = fitted.get("calibrated_range", {}).get(term.name)
        if seen and x > EXTRAPOLATION * seen[1]:
            beyond.append(f"{term.name} {x:.3g} is {x / seen[1]:.0f}x the largest calibrated ({seen[1]:.3g})")
    seconds = sum(parts.values())
    lo, hi = fitted["ratio_range"]
    bound = max(parts, key=parts.get) if parts else None
    resource = phase.fixed if bound == FIXED.name else next((t.resource for t in phase.terms if t.name == bound), None)
    return {"seconds": round(seconds, 6), "low": round(seconds * lo, 6), "high": round(seconds * hi, 6),
            "bound": resource, "terms_seconds": {k: round(v, 6) for k, v in parts.items()},
            "extrapolated": beyond, "calibrated_conditions": fitted.get("conditions")}


STARTUP = tuple(p for p in RESTART_PHASES if p != "restart_checkpoint_load_seconds")


def device_gap(plugins: Plugins, calibration: dict) -> str | None:
    """Why the run's start-up is not predicted: the calibration has no run on its kind of device (a CPU calibration's
    ranks sharing a node's cores say nothing of a GPU node's start-up); None where it has."""
    kind = "cuda" if plugins.spec.device == "cuda" else "cpu"
    kinds = sorted({d["kind"] for d in calibration.get("devices") or [{"kind": "cpu"}]})
    if kind in kinds:
        return None
    return (f"the calibration has no run on {kind} (its runs computed on {', '.join(kinds)}): start-up there is not "
            f"this machine's ranks relabelled; bring one in: ./submit-job.sh calibrate runs=DIR device={kind} out=FILE")


def _fitted_for(phase: Phase, plugins: Plugins, groups: dict) -> tuple[dict | None, str | None, str]:
    """(the group's fit, or another group's where the engine or launcher is not calibrated, which; the group)."""
    group = phase.group(plugins)
    if group in groups:
        return groups[group], None, group
    other = fallback_group(phase, plugins)
    return (groups[other], other, group) if other in groups else (None, None, group)


def _union(conditions: list[dict | None]) -> dict | None:
    """The conditions of a sum of phases: each one's range widened to all of theirs (None where one has none)."""
    if not conditions or any(not c or not c.get("other_cpu_fraction") for c in conditions):
        return None
    return {k: [min(c[k][0] for c in conditions), max(c[k][1] for c in conditions)]
            for k in ("contention", "other_cpu_fraction")}


def predict(plugins: Plugins, features: Features, calibration: dict) -> dict:
    """Every phase of the run (each a value and a range, or None with why), and the restart's total. A phase whose
    group the calibration lacks takes its fallback group's rates and says so in the phase itself (`borrowed`)."""
    phases, notes = {}, []
    gap = device_gap(plugins, calibration)
    for phase in PHASES.values():
        fitted, other, group = _fitted_for(phase, plugins, calibration["phases"].get(phase.name, {}))
        if gap and phase.name in STARTUP:
            phases[phase.name] = {"seconds": None, "why": gap}
        elif fitted is None:
            calibrated = ", ".join(sorted(calibration["phases"].get(phase.name, {}))) or "none"
            phases[phase.name] = {"seconds": None, "why": f"{group} is not in the calibration (calibrated: "
                                                          f"{calibrated})"}
        elif fitted.get("absent"):
            phases[phase.name] = {"seconds": None, "absent": True,
                                  "why": f"not a phase of {group}'s runs (none of the calibration's had it)"}
        else:
            phases[phase.name] = row = predict_phase(phase, features, fitted)
            if other:
                row["borrowed"] = f"{other}'s rates: {group} has no run in the calibration"
                notes.append(f"{phase.name}: {row['borrowed']}")
            notes += [f"{phase.name}: extrapolated: {e}" for e in row.get("extrapolated", [])]
    restart = [(phases[p], p) for p in RESTART_PHASES if not phases[p].get("absent")]
    if restart and all(p.get("seconds") is not None for p, _ in restart):
        phases[TOTAL] = {key: round(sum(p[key] for p, _ in restart), 6) for key in ("seconds", "low", "high")}
        phases[TOTAL]["bound"] = max(restart, key=lambda x: x[0]["seconds"])[1]
        phases[TOTAL]["calibrated_conditions"] = _union([p.get("calibrated_conditions") for p, _ in restart])
        if borrowed := sorted({p["borrowed"].split("'s rates")[0] for p, _ in restart if p.get("borrowed")}):
            phases[TOTAL]["borrowed"] = f"{', '.join(borrowed)}'s rates in part"
    else:
        why = next((p["why"] for p, _ in restart if p.get("seconds") is None), "no restart phase")
        phases[TOTAL] = {"seconds": None, "why": f"a restart phase is not predicted: {why}"}
    return {"phases": phases, "notes": sorted(set(notes))}
