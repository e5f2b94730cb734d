"""The result files' schema: names, versions, kinds, phases, states and labels, written down once. The harness
writes with it and analysis/ reads with it. Standard library only: analysis/ must import it where only matplotlib
is installed. The field-by-field reference is docs/results.md."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import ClassVar

SCHEMA_VERSION = 1  # summary.json; analysis reads every version in READABLE_VERSIONS
READABLE_VERSIONS = (1,)
SWEEP_SCHEMA_VERSION = 1  # sweep.json
MLPERF_SCHEMA_VERSION = 1  # mlperf.json (results/mlperf.py)
STUDY_SCHEMA_VERSION = 1  # study.json (campaigns/study/; analysis/study.py reads it)
ENDURE_SCHEMA_VERSION = 1  # endure.json (campaigns/endure.py): a failure campaign's goodput and badput
# a failure campaign's badput, in seconds, named after ml-goodput-measurement's buckets (docs/goodput.md)
BADPUT_BUCKETS = ("startup_seconds", "training_preparation_seconds", "checkpoint_save_seconds",
                  "checkpoint_restore_seconds", "first_steps_seconds", "wasted_progress_seconds", "other_seconds")
# summary.json's `goodput` (and predict's): one entry per scale, the run's own GPUs then at_gpus= (results/goodput.py)
GOODPUT_FIELDS = ("gpus", "mtbf_source", "job_mtbf_seconds", "save_seconds", "restart_seconds", "step_seconds",
                  "best_interval_seconds", "best_interval_steps", "goodput_at_best", "goodput_at_best_steps",
                  "young_daly_interval_seconds", "goodput_at_young_daly")
GIB = 1 << 30  # every *_gib_s figure is 2^30 bytes per second (MLPerf's tool prints these as "GB/second")
MIB = 1 << 20  # every *_mib_s figure is 2^20 bytes per second

# Files of a run directory.
SPEC, MLPERF, STUDY = "spec.json", "mlperf.json", "study.json"
# Where a study's figure comes from (docs/study.md): a run at the real size, real-size files written and read without
# training, the planner (exact), or the calibrated prediction model. A cell's figures each name one of these.
SOURCES = ("measured", "emulated", "planned", "predicted")

# Kinds of checkpoint files, by the DeepSpeed name of the file (or of the directory a sharded engine writes); a
# stack=fsdp2 checkpoint is DCP's own: a shard file per rank and one global metadata file.
# engine=fastpersist (ZeRO < 3) writes X.pt as `X.pt-R.N`: writer R of N data-parallel writers
_REPLICA = r"(-\d+\.\d+)?$"
KINDS = ("model_states", "optimizer_states", "layer_states", "dcp_shards", "dcp_metadata", "other")
_KIND_PATTERNS = (
    ("dcp_shards", re.compile(r"^__\d+_\d+\.distcp$")),
    ("dcp_metadata", re.compile(r"^\.metadata$")),
    ("layer_states", re.compile(r"^layer_\d+-model_\d+-model_states\.pt" + _REPLICA)),
    ("model_states", re.compile(r"^(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt" + _REPLICA)),
    ("optimizer_states", re.compile(r"^(bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt" + _REPLICA)))


def classify(relpath: str) -> str:
    """Kind of a file by the DeepSpeed name of its top component (sharded engines write directories)."""
    top = relpath.split("/", 1)[0]
    return next((kind for kind, pattern in _KIND_PATTERNS if pattern.match(top)), "other")


# The restart's phases: (name, mark that starts it, mark that ends it), in order. The summary gives each as the
# slowest rank's seconds (restart.phases.<name>).
RESTART_PHASES = (
    ("imports", "process_start", "imports_done"),
    ("dist_init", "imports_done", "dist_init_done"),
    ("model_build", "dist_init_done", "model_built"),
    ("engine_init", "model_built", "engine_initialized"),
    ("checkpoint_load", "engine_initialized", "checkpoint_loaded"),
    ("first_step", "checkpoint_loaded", "first_step_done"))
PHASE_NAMES = tuple(name for name, _, _ in RESTART_PHASES)
# What the prediction model predicts and every summary's `prediction` compares (results/prediction.py defines each)
PREDICTED_SAVE = ("save_blocking_seconds", "save_durable_seconds", "save_commit_seconds")
PREDICTED_RESTART = ("restart_launch_seconds", *(f"restart_{p}_seconds" for p in PHASE_NAMES))
PREDICTED_TOTAL = "restart_total_with_launch_seconds"
PREDICTED_PHASES = (*PREDICTED_SAVE, *PREDICTED_RESTART, PREDICTED_TOTAL)
# The crossover (predict/crossover.py, docs/prediction.md#the-crossover): prediction.crossover.crossover_checkpoint_bytes
# is the checkpoint size from which CROSSOVER_LOAD is predicted larger than every other restart phase (launch included);
# where there is none in the range, `status` says why
CROSSOVER_LOAD = "restart_checkpoint_load_seconds"
CROSSOVER_STATUSES = ("crosses", "already_largest", "never_largest", "not_predicted", "no_checkpoint")
CROSSOVER_RANGE_BYTES = (1 << 20, 1 << 50)  # the checkpoint sizes looked at unless predict is given others: 1 MiB - 1 PiB
# Memory high-water marks are recorded per phase: the restart's phases, then the steps after the first; for the
# checkpoint phase the same start-up phases, then training (saves included).
MEMORY_PHASES_RESTART = (*RESTART_PHASES, ("training", "first_step_done", "finished"))
MEMORY_PHASES_CHECKPOINT = (*RESTART_PHASES[:4], ("training", "engine_initialized", "finished"))
# emulate=true builds no model and trains nothing: after start-up the checkpoint phase only writes the files
MEMORY_PHASES_EMULATED = (*RESTART_PHASES[:2], ("save", "engine_initialized", "finished"))

# attribution= (docs/attribution.md): the sampler's rate, the marks a sampled rank pauses at (an anchor each: the
# sampler's clock to the ranks'), and the prefix of the pausing function's name in the sampler's stacks
ATTRIBUTION_RATE_HZ = 100
ATTRIBUTION_MODES = ("off", "python", "native")
ANCHOR_MARKS = ("imports_done", "finished")
ANCHOR_PREFIX = "rh_anchor__"
ANCHOR_SAMPLES = 5  # the pause lasts this many sampling intervals: samples inside it even when the sampler lags
ATTRIBUTION_RATE_ENV = "RH_ATTRIBUTION_RATE_HZ"  # set for the ranks of a sampled launch only

# A phase's I/O by source (docs/measurements.md#io-by-source): each mark carries, under `io`, what the phase it ends
# did (worker/io_marks.py). Every path a rank opens, stats or lists is in the source whose prefix is the longest to
# match it (rundir/observe.py names the prefixes; spec.json's io_sources records them with their file systems).
IO_SOURCES = ("environment", "extension_cache", "checkpoint", "run_dir", "system", "pseudo", "other")
# per source: rhio.c's counters (calls the process made through libc), then the files the dynamic loader mapped
IO_SOURCE_FIELDS = ("opens", "open_failures", "metadata_calls", "metadata_failures", "listings", "reads", "read_bytes",
                    "writes", "write_bytes", "mapped_files", "mapped_bytes")
# per process, from the kernel (/proc/self/io, getrusage): what the storage delivered, whatever the source
IO_KERNEL_FIELDS = ("storage_read_bytes", "storage_write_bytes", "read_chars", "read_syscalls", "major_faults")
# what a parallel file system's metadata service serves: every open (failed ones too), stat-family call and listing
IO_METADATA_FIELDS = ("opens", "open_failures", "metadata_calls", "listings")


def io_metadata_ops(counts: dict) -> int:
    """Metadata operations of one source's counts (IO_METADATA_FIELDS summed)."""
    return sum(counts.get(k) or 0 for k in IO_METADATA_FIELDS)

# The anatomy of a load and of a save (restart_harness/worker/anatomy.py defines each category).
LOAD_CATEGORIES = ("read", "deserialize", "copy", "wait", "other")
SAVE_CATEGORIES = ("serialize", "write", "fsync", "wait", "other")

# The spec fields that make two runs repeats of one configuration (seed, paths, ports and timeouts do not) are
# declared with the keys (spec/runspec.py configuration_fields) and recorded in spec.json (derived.configuration_fields);
# these are the fields of runs whose spec.json predates that record. Where else a configuration can differ: another
# machine or another file system (PLACE_FIELDS).
CONFIG_FIELDS_UNRECORDED = ("model", "shape", "shrink", "stack", "precision", "tp", "pp", "dp", "zero", "nodes",
                            "ranks_per_node", "replicate", "engine", "engine_options", "device", "launcher", "cache",
                            "env_cache", "iters", "save_interval", "after", "micro_batch", "grad_accum", "seq_len",
                            "anatomy", "trace", "emulate", "subset")


def config_fields(spec: dict) -> tuple[str, ...]:
    """The configuration fields of a run's spec.json (or of its summary's spec)."""
    return tuple((spec.get("derived") or {}).get("configuration_fields") or CONFIG_FIELDS_UNRECORDED)


# What a configuration field was before the harness recorded it (spec.json of older runs)
CONFIG_DEFAULTS = {"zero": 1, "emulate": False, "subset": False, "env_cache": "auto"}


def restart_conditions(restart: dict) -> dict:
    """How one restart record started, where a restart-only re-run may differ from its run's spec: its launcher,
    the page cache of the checkpoint (cache=) and of the environment (env_cache=) as requested, and whether the
    environment was staged (env_stage=). Restarts that differ in any of these are never pooled into one figure
    (the terminal's restarts row, the report's configurations). None: a record older than the field."""
    return {"launcher": restart.get("launcher"), "cache": (restart.get("cache") or {}).get("requested"),
            "env_cache": (restart.get("environment_cache") or {}).get("requested"),
            "staged": bool(restart.get("staging"))}
PLACE_FIELDS = (("host", "hostname"), ("checkpoint_filesystem", "mount"), ("checkpoint_filesystem", "type"),
                ("checkpoint_object_store", "endpoint_url"))  # s3:// runs: never pooled with file-system runs


def span(low: object, high: object, spec: str = "") -> str:
    """`-0.250 to 0.007`: every range the harness prints, each end formatted with spec (a dash between two numbers
    that may be negative reads as a minus sign)."""
    return f"{format(low, spec)} to {format(high, spec)}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 rank`, `2 ranks`: a number with its noun, in every line the harness prints."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def model_label(spec: dict) -> str:
    """`70B` or `70B-shrink64`: the run directory's and every table's name for the model."""
    shrink = spec.get("shrink") or 1
    return str(spec["model"]) if shrink == 1 else f"{spec['model']}-shrink{shrink}"


def layout_label(spec: dict) -> str:
    """`tp2 pp4 dp1` (and `zero3` for a ZeRO stage other than 1, `2n` with several nodes, `subset 8/64` when only
    the first node's ranks ran)."""
    nodes, zero = spec.get("nodes") or 1, spec.get("zero") or 1
    derived = spec.get("derived") or {}
    subset = (f" subset {derived.get('launched_ranks', spec.get('ranks_per_node'))}/"
              f"{derived.get('world_size', spec['tp'] * spec['pp'] * spec['dp'])}" if spec.get("subset") else "")
    return (f"tp{spec['tp']} pp{spec['pp']} dp{spec['dp']}" + (f" zero{zero}" if zero != 1 else "")
            + (f" {nodes}n" if nodes > 1 else "") + subset)


DEFAULT_STACK, DEFAULT_TARGET = "deepspeed", "filesystem"  # what a label leaves unsaid


def target_name(spec: dict) -> str:
    """The storage target of a run's spec.json (runs of harness 0.2.0 name none: an s3:// ckpt_dir was S3)."""
    if spec.get("checkpoint_target"):
        return str(spec["checkpoint_target"])
    return "s3" if str(spec.get("ckpt_dir") or "").startswith("s3://") else DEFAULT_TARGET


def _unless(value: str, default: str) -> list[str]:
    return [] if value == default else [value]


def stack_engine(spec: dict) -> list[str]:
    """The training stack where it is not DeepSpeed, then the engine: ["default"], ["fsdp2", "dcp"]."""
    return [*_unless(str(spec.get("stack") or DEFAULT_STACK), DEFAULT_STACK), str(spec["engine"])]


def engine_label(spec: dict) -> str:
    """The engine and each on/off option the run changed from the engine's default: `dcp async_save` (switched on),
    `fastpersist no_io_buffer_double` (switched off); the training stack first where it is not DeepSpeed
    (`fsdp2 dcp`), and the storage target last where it is not a file system (`default s3`). Specs written before
    the defaults were recorded (no engine_option_defaults) name every option that is on."""
    options, defaults = spec.get("engine_options") or {}, spec.get("engine_option_defaults")
    if not defaults:
        changed = [k for k, v in options.items() if v is True]
    else:
        changed = [k if v else f"no_{k}" for k, v in options.items()
                   if isinstance(v, bool) and v != defaults.get(k, False)]
    return " ".join([*stack_engine(spec), *changed, *_unless(target_name(spec), DEFAULT_TARGET)])


# ---- the per-rank event records (events/<record>/rank-N.jsonl) ------------------------------------------------------
# Each line is {"t": wall time, "rank": N, "event": <kind>, **fields}. The worker writes these dataclasses (each kind
# in one place); readers (results/, analysis/) read the lines as dicts. `extra` fields are merged into the line.
@dataclass(frozen=True)
class Event:
    kind: ClassVar[str]

    def fields(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        extra = data.pop("extra", None) or {}
        return {RENAMED.get(k, k): v for k, v in data.items() if k not in OMIT_IF_NONE or v is not None} | extra


RENAMED = {"asynchronous": "async"}  # a Python keyword in the file
OMIT_IF_NONE = ("flush",)  # written only where there is one (an asynchronous save's background part)


def _event(name: str, kind: str, /, **fields) -> type:
    """An event of these fields, in their order: name=type (required) or name=(type, default or dataclasses.field)."""
    return dataclasses.make_dataclass(name, [(k, *v) if isinstance(v, tuple) else (k, v) for k, v in fields.items()],
                                      bases=(Event,), frozen=True, namespace={"kind": kind})


# Where the rank runs: its process, the host (the node's hostname), the launcher's node index (CROSS_RANK:
# SLURM_NODEID, PALS_NODEID, torchrun's GROUP_RANK; 0 under DeepSpeed's single-node launcher) and the main thread's
# identifier (pthread_t: its samples in a sampler's trace). Records written before harness 0.4 carry the pid only.
Process = _event("Process", "process", pid=int, host=(str, ""), node=(int | None, None), thread=(int | None, None))
# attribution: a short pause of the rank inside a function named ANCHOR_PREFIX + mark, right after that mark, from
# wall time `start` to `end`: the sampler's trace shows it, which puts the sampler's clock on the ranks' one
# (results/attribution.py).
Anchor = _event("Anchor", "anchor", mark=str, start=float, end=float)
# A milestone (schema RESTART_PHASES' marks, `finished`), with the memory high-water marks of the phase it ends
# (peak_rss_bytes, peak_device_bytes).
Mark = _event("Mark", "mark", name=str, extra=(dict, field(default_factory=dict)))


@dataclass(frozen=True)
class Layout(Event):
    kind = "layout"
    dp_rank: int
    tp_rank: int
    pp_rank: int
    device: str
    local_parameters: int
    extra: dict = field(default_factory=dict)  # stack, emulated

    @classmethod
    def of(cls, fields: dict) -> Layout:
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        return cls(**{k: fields[k] for k in names}, extra={k: v for k, v in fields.items() if k not in names})


@dataclass(frozen=True)
class Step(Event):
    kind = "step"
    step: int
    loss: float
    seconds: float
    last: int
    in_flight: bool  # an asynchronous save's flush was in flight during the step
    # the step's highest resident set less the one it started with (worker/memory.py): the training's own transient
    # host memory, against which a save's memory is read (docs/measurements.md#memory-per-save)
    rss_peak_added_bytes: int | None = None
    rss_bytes: int | None = None  # the resident set when the step began


@dataclass(frozen=True)
class Save(Event):
    """One rank's save, once committed (docs/measurements.md defines each figure)."""

    kind = "save"
    tag: str
    step: int
    start: float  # wall time the save began
    blocking_seconds: float
    durable_seconds: float
    commit_seconds: float
    files: list  # {path relative to the tag, bytes, seconds}
    bytes: int
    asynchronous: bool
    in_flight_steps: int
    anatomy: dict | None
    flush: dict | None = None
    engine_statistics: dict | None = None  # the engine's own account of this save (CheckpointIO.statistics)
    # checksums=: seconds this rank took to read its committed files back for their sha256 (each file's is in files)
    checksum_seconds: float | None = None
    extra: dict = field(default_factory=dict)  # the stack's facts: universal_info, emulated, waves
    # host memory of the save from its start to its commit (worker/manager.py Memory; docs/measurements.md)
    memory: dict | None = None
    # what made the files durable inside durable_seconds: by "engine" (its own fsync, Engine.durable_on_wait) or
    # "harness fsync" (the target's make_durable), engine_wait_seconds (its flush, after the save returned) and
    # make_durable_seconds (the harness's fsync of the files and their folders)
    durability: dict | None = None


@dataclass(frozen=True)
class Loaded(Event):
    kind = "loaded"
    tag: str
    files: list  # {path, seconds} of every engine load, in order (the recorder's own clock)
    # wall time just before the load began and just after it ended, taken outside the anatomy's window
    outer_start: float
    outer_end: float
    engine_statistics: dict | None = None  # the engine's own account of the load (CheckpointIO.load_statistics)
    # seconds inside the load that are not part of it (Rank.untimed: an emulated load's verification, and its
    # waiting for the other waves of ranks): the checkpoint_load phase leaves them out
    untimed_seconds: float = 0.0


Digest = _event("Digest", "digest", tag=str, seconds=float, tensors=int)
LoadAnatomy = _event("LoadAnatomy", "load_anatomy", extra=dict)  # the anatomy window's record (worker/anatomy.py)
Verify = _event("Verify", "verify", extra=dict)  # stacks/base.py Verification.event()
Done = _event("Done", "done", max_rss_bytes=int)
Error = _event("Error", "error", message=str, traceback=str)
