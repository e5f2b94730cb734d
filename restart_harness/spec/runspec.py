"""RunSpec: every setting of one run, each field a declared key (spec/keys.py). Frozen: parsed and validated once
(command/), completed against the machine once (machine.py), written to spec.json (spec/record.py). The checks that
depend on the stack, the engine or the storage target are theirs."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from restart_harness.errors import UsageError
from restart_harness.schema import ATTRIBUTION_MODES
from restart_harness.spec.keys import SIZE_MAX, Path, Seconds, key, keys_of, plausible_rate
from restart_harness.spec.model_shape import ModelShape

PHASES = ("all", "checkpoint")  # `restart` is a command of its own: ./submit-job.sh restart run=DIR
MAX_WORLD = 1 << 17  # ranks: more than the largest training jobs published (about 100,000 GPUs)
_WALLTIME = re.compile(r"^(\d+-)?\d+:\d{2}:\d{2}$")
# What a checkpoint holds at least, a parameter: its weights and Adam's two moments in fp32 (bf16 runs add more)
STATE_BYTES_PER_PARAMETER = 12


@dataclass(frozen=True)
class RunSpec:
    """What the user asked for, with defaults filled in."""

    model: str
    shape: ModelShape
    model_source: str = ""
    engine_options: dict = field(default_factory=dict)  # the engine's declared options (engines/<name>.py)
    # their defaults, so that results name only the options a run changed (restart_harness/schema.py engine_label)
    engine_option_defaults: dict = field(default_factory=dict)

    shrink: int = key(1, "divide head dimension, FFN and vocabulary (and the default seq_len) by K; layers and "
                         "heads stay, so file names and counts are the real model's", group="model", minimum=1)
    tp: int = key(1, "tensor-parallel degree (Megatron-style split)", group="layout", minimum=1, restart=True)
    pp: int = key(1, "pipeline-parallel degree (DeepSpeed PipelineModule when > 1)", group="layout", minimum=1,
                  restart=True)
    dp: int | None = key(None, "data-parallel degree; default nodes x ranks_per_node / (tp x pp), or 1",
                         group="layout", minimum=1, restart=True)
    nodes: int = key(1, "nodes (slurm and pbs launchers)", group="layout", minimum=1, restart=True)
    ranks_per_node: int | None = key(None, "ranks (GPUs) per node; default tp x pp x dp / nodes", group="layout",
                                     minimum=1, restart=True)
    zero: int = key(1, "stack=deepspeed: ZeRO stage; 1 shards the optimizer state over the data-parallel ranks, 2 "
                       "also the gradients (the same files as 1), 3 also the parameters (model files per "
                       "data-parallel rank); 2 and 3 need pp=1", group="layout", minimum=1, maximum=3)
    replicate: int | None = key(None, "stack=fsdp2: hybrid sharding (HSDP), the data-parallel ranks as this many "
                                      "replicas that each shard the whole state over dp / replicate ranks; default "
                                      "nodes (shard within a node, replicate across nodes)", group="layout",
                                minimum=1, restart=True)
    stack: str = key("deepspeed", "training stack (restart_harness/stacks/; list below): deepspeed = DeepSpeed "
                                  "ZeRO-1 with TP/PP; fsdp2 = torch FSDP2 (fully_shard over the data-parallel ranks) "
                                  "checkpointed with Distributed Checkpoint: engine=dcp, tp=1, pp=1 (docs/fsdp2.md)",
                     group="training")
    precision: str = key("bf16", "training precision (ZeRO-1 keeps fp32 master weights either way)",
                         group="training", choices=("bf16", "fp32"))
    iters: int = key(4, "training steps of the checkpoint phase", group="training", minimum=1)
    save_interval: int = key(2, "checkpoint every N steps", group="training", minimum=1)
    after: int = key(2, "steps trained after the restart", group="training", minimum=1)
    micro_batch: int = key(2, "samples per rank per micro-batch", group="training", minimum=1)
    grad_accum: int = key(2, "micro-batches per optimizer step", group="training", minimum=1)
    seq_len: int | None = key(None, "tokens per sample; default min(max_position_embeddings, 2048) / shrink, >= 16",
                              group="training", minimum=1)
    lr: float = key(1e-4, "AdamW learning rate", config=False, group="training", above=0)
    seed: int = key(1234, "seed of weights and synthetic data", config=False, group="training", minimum=0)
    engine: str = key("default", "checkpoint engine (engines/; list below); its options are keys too; when not "
                                 "given, the stack's own: default (stack=deepspeed), dcp (stack=fsdp2)",
                      group="checkpoint")
    cache: str = key("drop", "page cache before the restart: drop = evict the checkpoint's pages, warm = leave "
                             "them", group="checkpoint", choices=("drop", "warm"), restart=True)
    env_cache: str = key("auto", "page cache of the Python environment and the extension cache before the restart: "
                                 "drop = evict them too (a replacement node's cold start), warm = keep them resident "
                                 "(the checkpoint's eviction is then file by file), keep = leave them as they are and "
                                 "evict the checkpoint file by file (a shared node's other jobs keep their pages), "
                                 "auto = as the checkpoint's cache step leaves them (cache=drop as root evicts every "
                                 "clean page)", group="checkpoint", choices=("auto", "drop", "warm", "keep"),
                         restart=True)
    env_stage: Path | None = key(None, "run the restart's ranks from a copy of the Python environment and the "
                                        "extension cache made in this folder just before they start (node-local "
                                        "storage, /dev/shm), as centres stage against import storms; the copy's time "
                                        "is the restart's `staging`; removed when the restart ends",
                                 config=False, group="checkpoint", restart=True)
    ckpt_dir: Path | None = key(None, "where checkpoints go: a parallel file system, or s3://bucket/prefix "
                                      "(engine=default or dcp; docs/s3.md); default <run dir>/checkpoint",
                                config=False, group="checkpoint", sweep=False)
    keep: bool = key(True, "false: delete the checkpoint once the run's results are written", config=False, group="checkpoint",
                     restart=True)
    checksums: str = key("auto", "sha256 of every checkpoint file, taken by the rank that wrote it once the save is "
                                 "committed (not timed) and checked before a restart loads it: a torn file of the "
                                 "right size fails the restart; auto = on for engines whose files are written in the "
                                 "background region by region (datastates), off otherwise (it reads every checkpoint "
                                 "back); file systems only", config=False, group="checkpoint", choices=("auto", "on", "off"))
    baseline: bool = key(True, "measure the checkpoint storage (cached) and report save/load efficiency",
                         config=False, group="checkpoint")
    baseline_max_age_hours: float = key(24.0, "a cached storage baseline older than this is measured again before "
                                              "the run (a storage's speed drifts; efficiencies against a stale one "
                                              "mislead)", config=False, group="checkpoint", unit="h", above=0)
    emulate: bool = key(False, "no model, no training: each rank writes exactly the planned files of each checkpoint "
                               "(real names, sizes, tensors, format; one per save_interval steps up to iters) "
                               "through the engine, and its restart reads the latest back (docs/emulation.md)",
                        group="checkpoint")
    subset: bool = key(False, "emulate=true with nodes > 1: run only the first node's ranks, here (MLPerf Storage's "
                              "subset mode); they write and read exactly their files of the whole layout's "
                              "checkpoint", group="checkpoint")
    emulate_memory_gib: float | None = key(None, "emulate: file state a node may hold at once (ranks work in waves "
                                                 "within it); default 60% of the memory available at launch",
                                           config=False, group="checkpoint", unit="GiB", above=0)
    anatomy: bool = key(True, "split each load and save into read/write, (de)serialization, copies, waiting (I/O "
                              "counters preloaded into every rank; docs/anatomy.md)", group="observe", restart=True)
    trace: bool = key(False, "record every POSIX I/O call on the checkpoint with dftracer; raw traces in "
                             "traces/<record>/, summarized per phase", group="observe", restart=True)
    attribution: str = key("off", "say what each restart phase's seconds went to (imports of which package, a JIT "
                                  "op's build, communicator set-up, waits on other ranks, ...): py-spy samples the "
                                  "launcher and every rank, python = Python stacks, native = with C/C++ frames too "
                                  "(slower); one flame graph per rank and phase (docs/attribution.md). Off by default: "
                                  "sampling slows what it samples (docs/benchmarks.md)", group="observe",
                           choices=ATTRIBUTION_MODES, restart=True)
    calibration: str = key("default", "the prediction model's calibration: configs/calibration/NAME.json, or the path "
                                      "of a file ./submit-job.sh calibrate wrote; every run's summary sets the "
                                      "prediction made with it before launch beside what was measured "
                                      "(docs/prediction.md)", config=False, group="observe", sweep=False)
    device: str = key("auto", "auto = cuda when NVIDIA devices are present, else cpu (DeepSpeed over gloo)",
                       group="launch", choices=("auto", "cpu", "cuda"))
    launcher: str = key("local", "what starts the ranks (restart_harness/launchers/; list below): local = DeepSpeed's "
                                 "own launcher (also spelled deepspeed), torchrun, mpiexec, prefork (forks the ranks from "
                                 "one process that imported their libraries), slurm (sbatch + srun), pbs (qsub + "
                                 "mpiexec); local and torchrun take nodes > 1 inside a Slurm allocation",
                        group="launch", restart=True)
    timeout: int = key(1800, "seconds one launch may take before its whole process group is killed",
                       config=False, group="launch", unit="s", minimum=1, maximum=28 * 86400, restart=True)
    threads: int | None = key(None, "CPU threads per rank (OMP_NUM_THREADS, torch's intra-op threads); default the "
                                    "node's CPUs / ranks_per_node, at least 1: ranks neither idle cores nor fight for "
                                    "them (a restart's deserialization and copies are CPU work)", config=False, group="launch",
                              minimum=1, maximum=1024, restart=True)
    master_port: int | None = key(None, "rendezvous port; default a free one", config=False, group="launch", minimum=1,
                                  maximum=65535, restart=True)
    phase: str = key("all", "all = checkpoint then restart; checkpoint = the checkpoint phase only (restart an "
                            "existing run with ./submit-job.sh restart run=DIR)", config=False, group="launch", choices=PHASES,
                     sweep=False)
    repeats: int = key(1, "runs of each combination (a sweep folder when > 1); restart: restarts",
                       config=False, group="launch", minimum=1, maximum=10_000, sweep=False, restart=True)
    max_runs: int = key(64, "a sweep expanding to more runs (combinations x repeats) is refused unless this is raised",
                        config=False, group="launch", minimum=1, sweep=False)
    dry_run: bool = key(False, "write ds_config.json and the launch (and job) scripts, print them, launch nothing; "
                               "every path is checked as a run's is (results_dir, ckpt_dir, env_stage, env_hook), "
                               "not what a run would use of this node (free space, memory, the port, its modules)",
                        config=False, group="launch", sweep=False)
    wait: bool = key(False, "launcher=slurm|pbs from a login node: return when the job ends, showing its progress, "
                            "with the run's summary (exit 0) or its one-line failure (exit 1)", config=False, group="cluster",
                     sweep=False)
    walltime: str = key("01:00:00", "slurm/pbs job time limit, HH:MM:SS or D-HH:MM:SS", config=False, group="cluster")
    queue: str | None = key(None, "Slurm partition / PBS queue", config=False, group="cluster")
    account: str | None = key(None, "Slurm account / PBS project (-A)", config=False, group="cluster")
    filesystems: str | None = key(None, "pbs: -l filesystems= (ALCF, e.g. home:eagle)", config=False, group="cluster")
    env_hook: Path | None = key(None, "bash file sourced by the job script and every launch script (modules, "
                                      "conda)", config=False, group="cluster", sweep=False)
    # goodput under failures (results/goodput.py, docs/goodput.md): one failure rate, or Llama 3's published one
    mtbf: Seconds | None = key(None, "the job's mean time between failures at its own GPUs (the same rate per GPU at "
                                     "at_gpus=); `endure` injects failures at this rate", group="goodput", unit="seconds",
                               above=0, config=False, restart=True)
    mtbf_per_node: Seconds | None = key(None, "each node's mean time between failures (a job of N nodes fails every "
                                              "mtbf_per_node / N)", group="goodput", unit="seconds", above=0,
                                        config=False, restart=True)
    mtbf_per_gpu: Seconds | None = key(None, "each GPU's mean time between failures (a job of G GPUs fails every "
                                             "mtbf_per_gpu / G); with no MTBF key, Meta's Llama 3 report's: 419 "
                                             "interruptions in 54 days on 16,384 GPUs", group="goodput", unit="seconds",
                                       above=0, config=False, restart=True)
    at_gpus: int = key(16_384, "the best checkpoint interval and its goodput are also given at this many GPUs "
                               "(default Llama 3's 16,384)", group="goodput", minimum=1, maximum=MAX_WORLD,
                       config=False, restart=True)
    results_dir: Path = key("results", "where run directories go", config=False, group="output", sweep=False)

    # ---- derived values -------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * (self.dp or 1)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * (self.dp or 1)

    @property
    def walltime_seconds(self) -> int:
        """walltime= (HH:MM:SS or D-HH:MM:SS) in seconds."""
        days, _, clock = self.walltime.rpartition("-")
        hours, minutes, seconds = (int(x) for x in clock.split(":"))
        return (int(days) if days else 0) * 86400 + hours * 3600 + minutes * 60 + seconds

    @property
    def layout(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}"

    @property
    def across_nodes(self) -> bool:
        """The launch starts ranks on more than one node (nodes > 1, and not subset=true's first node only)."""
        return self.nodes > 1 and not self.subset

    @property
    def launched_ranks(self) -> int:
        """The ranks a launch starts: the whole layout, or with subset=true the first node's."""
        return self.ranks_per_node if self.subset else self.world_size

    @property
    def model_label(self) -> str:
        return self.model if self.shrink == 1 else f"{self.model}-shrink{self.shrink}"

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["shape"] = dataclasses.asdict(self.shape)
        data["derived"] = {
            "configuration_fields": configuration_fields(), "world_size": self.world_size,
            "launched_ranks": self.launched_ranks, "global_batch": self.global_batch,
            "num_parameters": self.shape.num_parameters(), "pipeline_module": self.pp > 1, "shrunk": self.shrink > 1}
        return data

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        """A RunSpec from spec.json (fields of older or newer harness versions it does not know are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["shape"] = ModelShape(**data["shape"])
        return cls(**data)

    # ---- validation (pure) --------------------------------------------------------------
    def resolve(self) -> RunSpec:
        """The spec as given -> the spec a run uses: the model shrunk, the layout derived and checked, the sequence
        length filled in; raises UsageError naming the numbers. Call once, on a spec as parsed."""
        s = self.shape.shrunk(self.shrink)
        if (state := state_bytes(s)) > SIZE_MAX:  # every shape key is bounded alone, and so is their checkpoint
            raise UsageError(f"hidden_size={s.hidden_size} intermediate_size={s.intermediate_size} num_hidden_layers="
                             f"{s.num_hidden_layers} vocab_size={s.vocab_size}: a model of {s.num_parameters():.3g} "
                             f"parameters, whose checkpoint would hold at least {state / 2**50:,.0f} PiB "
                             f"({STATE_BYTES_PER_PARAMETER} bytes a parameter); accepted: a model whose checkpoint is "
                             f"at most {SIZE_MAX / 2**50:,.0f} PiB")
        spec = dataclasses.replace(self, shape=s).with_layout()
        # Sequence length shapes activations only, never the checkpoint: shrink divides it too.
        seq_len = spec.seq_len or min(spec.shape.max_position_embeddings, max(16, 2048 // spec.shrink))
        if seq_len > spec.shape.max_position_embeddings:
            raise UsageError(f"seq_len={seq_len} exceeds max_position_embeddings={spec.shape.max_position_embeddings}")
        if not _WALLTIME.match(spec.walltime):
            raise UsageError(f"walltime={spec.walltime}: accepted HH:MM:SS (or D-HH:MM:SS)")
        if spec.subset and not spec.emulate:
            raise UsageError("subset=true: only an emulated checkpoint can be written by part of its ranks (training "
                             "needs them all); accepted with emulate=true")
        if spec.emulate_memory_gib is not None and not spec.emulate:
            raise UsageError(f"emulate_memory_gib={spec.emulate_memory_gib:g}: the file state an emulated node holds at "
                             "once; a real run's ranks hold their model; accepted with emulate=true")
        if spec.subset and spec.nodes == 1:
            raise UsageError("subset=true with nodes=1: the whole layout runs on this node already; accepted: "
                             "nodes > 1 (this node runs the first node's ranks_per_node ranks)")
        if len(given := [f"{k}={getattr(spec, k):g}" for k in ("mtbf", "mtbf_per_node", "mtbf_per_gpu")
                          if getattr(spec, k) is not None]) > 1:
            raise UsageError(f"{' and '.join(given)}: one failure rate; accepted: one of mtbf=, mtbf_per_node=, "
                             "mtbf_per_gpu=")
        if spec.save_interval > spec.iters:
            raise UsageError(f"save_interval={spec.save_interval} is larger than iters={spec.iters}: no checkpoint "
                             "would be written; accepted: 1 <= save_interval <= iters")
        return dataclasses.replace(spec, seq_len=seq_len)

    def with_layout(self, **layout) -> RunSpec:
        """This spec at a layout (tp, pp, dp, nodes, ranks_per_node as given; dp and ranks_per_node derived where
        None), checked against the (already resolved) model: a run's, or a restart's at another layout."""
        spec = dataclasses.replace(self, **layout)
        dp, ranks_per_node = _ranks(spec)
        spec = dataclasses.replace(spec, dp=dp, ranks_per_node=ranks_per_node)
        _check_model_split(spec)
        return spec

    def save_steps(self) -> list[int]:
        """The training steps after which the checkpoint phase saves (a list as long as save_count: for the ranks,
        which take them one by one)."""
        return list(range(self.save_interval, self.iters + 1, self.save_interval))

    @property
    def save_count(self) -> int:
        """How many saves the checkpoint phase makes, by arithmetic (a check never builds a list as long as iters)."""
        return self.iters // self.save_interval


def _ranks(spec: RunSpec) -> tuple[int, int]:
    """(dp, ranks_per_node), derived where not given and checked against each other."""
    per_replica = spec.tp * spec.pp
    dp = spec.dp
    if dp is None and spec.ranks_per_node is not None:
        ranks = spec.nodes * spec.ranks_per_node
        if ranks % per_replica:
            raise UsageError(f"nodes x ranks_per_node = {spec.nodes} x {spec.ranks_per_node} = {ranks} ranks is "
                             f"not a multiple of tp x pp = {spec.tp} x {spec.pp} = {per_replica}")
        dp = ranks // per_replica
    dp = dp or 1
    world = per_replica * dp
    if world > MAX_WORLD:
        raise UsageError(f"tp x pp x dp = {spec.tp} x {spec.pp} x {dp} = {world:,} ranks; accepted: at most "
                         f"{MAX_WORLD:,} (larger than any training job run to date)")
    ranks_per_node = spec.ranks_per_node
    if ranks_per_node is None:
        if world % spec.nodes:
            raise UsageError(f"world size tp x pp x dp = {spec.tp} x {spec.pp} x {dp} = {world} does not split over "
                             f"nodes={spec.nodes}")
        ranks_per_node = world // spec.nodes
    if spec.nodes * ranks_per_node != world:
        raise UsageError(f"dp={dp} does not match the ranks: tp x pp x dp = {spec.tp} x {spec.pp} x {dp} = {world}, "
                         f"but nodes x ranks_per_node = {spec.nodes} x {ranks_per_node} = "
                         f"{spec.nodes * ranks_per_node}")
    return dp, ranks_per_node


def state_bytes(shape: ModelShape) -> int:
    """The least a checkpoint of this model holds (STATE_BYTES_PER_PARAMETER a parameter)."""
    return shape.num_parameters() * STATE_BYTES_PER_PARAMETER


def plausible_rates(shape: ModelShape, ranks: int, rates: dict) -> None:
    """The rates given (`rates`: name -> value or None) lead to plausible times (keys.plausible_rate): the
    checkpoint's bytes at a bandwidth (`*_gbps`), one operation a rank at a metadata rate (`*_ops_s`)."""
    for name, value in rates.items():
        if value is not None and name.endswith("_gbps"):
            plausible_rate(name, value, state_bytes(shape), f"the checkpoint's {state_bytes(shape):,} bytes", scale=1e9)
        elif value is not None and name.endswith("ops_s"):
            plausible_rate(name, value, ranks, f"one operation for each of the {ranks} ranks")


def _check_model_split(spec: RunSpec) -> None:
    s, tp = spec.shape, spec.tp
    if s.hidden_size % s.num_attention_heads and s.head_dim is None:
        raise UsageError(f"hidden_size={s.hidden_size} is not divisible by num_attention_heads={s.num_attention_heads}")
    if s.num_attention_heads % s.num_key_value_heads:
        raise UsageError(f"num_attention_heads={s.num_attention_heads} is not a multiple of "
                         f"num_key_value_heads={s.num_key_value_heads}")
    if s.dim_per_head % 2:
        raise UsageError(f"head dimension {s.dim_per_head} must be even (rotary embeddings)")
    checks = [("num_attention_heads", s.num_attention_heads), ("num_key_value_heads", s.num_key_value_heads),
              ("intermediate_size", s.intermediate_size), ("vocab_size", s.vocab_size)]
    for name, value in checks:
        if value % tp:
            hint = (" (key/value heads are split across TP ranks, not replicated)" if name == "num_key_value_heads"
                    else "")
            raise UsageError(f"tp={tp} does not divide {name}={value}{hint}; accepted: tp dividing "
                             + ", ".join(f"{n}={v}" for n, v in checks))
    if spec.pp > s.num_hidden_layers:
        raise UsageError(f"pp={spec.pp} is larger than the {s.num_hidden_layers} transformer layers (each pipeline "
                         f"stage needs at least one); accepted: pp from 1 to {s.num_hidden_layers}")


def run_keys() -> dict:
    """The declared keys of a run (not MODEL, shape fields or engine options)."""
    return keys_of(RunSpec)


def configuration_fields() -> list[str]:
    """The spec fields that make two runs repeats of one configuration (keys declared config=False do not: seeds,
    paths, ports, timeouts), in declaration order; spec.json carries them (derived.configuration_fields) for
    analysis/, which reads result files without this module."""
    declared = run_keys()
    return [f.name for f in dataclasses.fields(RunSpec)
            if (f.name in declared and declared[f.name].config) or f.name in ("model", "shape", "engine_options")]
