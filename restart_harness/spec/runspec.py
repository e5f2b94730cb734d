"""RunSpec: every resolved setting of one run, validated once, then passed around as one object."""

from __future__ import annotations

import dataclasses
import glob
from dataclasses import dataclass, field

from restart_harness.errors import UsageError
from restart_harness.spec.model_shape import ModelShape

PRECISIONS = ("bf16", "fp32")
CACHE_MODES = ("drop", "warm")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "torchrun", "slurm", "pbs")
PHASES = ("all", "checkpoint")  # phase=restart re-runs an existing run: restart_harness/spec/phases.py


@dataclass
class RunSpec:
    """What the user asked for, with defaults filled in. Field docs are the key's help text."""

    model: str
    shape: ModelShape
    model_source: str = ""
    # layout
    tp: int = 1  # tensor-parallel degree (Megatron-style split)
    pp: int = 1  # pipeline-parallel degree (DeepSpeed PipelineModule when > 1)
    dp: int | None = None  # data-parallel degree; derived from nodes x ranks_per_node when omitted, else 1
    nodes: int = 1
    ranks_per_node: int | None = None  # derived from tp x pp x dp / nodes when omitted
    shrink: int = 1  # divide head dim, ffn and vocab by K, keep layers and heads
    # training
    precision: str = "bf16"  # bf16 | fp32
    iters: int = 4  # training steps of the checkpoint phase
    save_interval: int = 2  # checkpoint every N steps
    after: int = 2  # steps trained after the restart
    micro_batch: int = 2
    grad_accum: int = 2
    seq_len: int | None = None  # default: min(max_position_embeddings, 2048) / shrink (>= 16)
    lr: float = 1e-4
    seed: int = 1234
    # checkpoint engine
    engine: str = "default"
    engine_options: dict = field(default_factory=dict)
    # where and how
    device: str = "auto"  # auto | cpu | cuda
    launcher: str = "local"
    cache: str = "drop"  # drop | warm: evict the checkpoint from the page cache before the restart
    results_dir: str = "results"
    ckpt_dir: str | None = None  # default: <run dir>/checkpoint
    timeout: int = 1800  # seconds one launch may take before its process group is killed
    baseline: bool = True  # measure the checkpoint file system once (cached) and report save/load efficiency
    master_port: int | None = None
    # phases, repeats, clusters (restart_harness/launch/launchers.py, restart_harness/generate/batch.py)
    phase: str = "all"  # all | checkpoint (phase=restart run=DIR re-runs only the restart of an existing run)
    repeats: int = 1  # runs of each combination (phase=restart: restarts)
    keep: bool = True  # keep=false deletes the checkpoint after a complete run
    dry_run: bool = False  # write and print ds_config and launch scripts, run nothing
    walltime: str = "01:00:00"  # slurm/pbs: job time limit, HH:MM:SS
    queue: str | None = None  # slurm partition / pbs queue
    account: str | None = None  # slurm account / pbs project (-A)
    filesystems: str | None = None  # pbs: -l filesystems=home:eagle (ALCF)
    env_hook: str | None = None  # bash file sourced by the job script and every launch script (modules, conda)

    # ---- derived values -------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * (self.dp or 1)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * (self.dp or 1)

    @property
    def layout(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}"

    @property
    def model_label(self) -> str:
        return self.model if self.shrink == 1 else f"{self.model}-shrink{self.shrink}"

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["shape"] = dataclasses.asdict(self.shape)
        data["derived"] = {
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "num_parameters": self.shape.num_parameters(),
            "pipeline_module": self.pp > 1,
            "shrunk": self.shrink > 1,
        }
        return data

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        data = {k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}}
        data["shape"] = ModelShape(**data["shape"])
        return cls(**data)

    # ---- validation ---------------------------------------------------------------
    def resolve(self) -> RunSpec:
        """Fill derived defaults and check the layout; raises UsageError naming the numbers."""
        for key in ("tp", "pp", "nodes", "shrink", "iters", "save_interval", "after", "micro_batch",
                    "grad_accum", "timeout", "repeats"):
            if getattr(self, key) < 1:
                raise UsageError(f"{key}={getattr(self, key)}: must be a positive integer")
        for key in ("dp", "ranks_per_node", "seq_len"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise UsageError(f"{key}={value}: must be a positive integer")
        if self.lr <= 0:
            raise UsageError(f"lr={self.lr}: must be a positive number")
        self.shape = self.shape.shrunk(self.shrink)
        self._resolve_ranks()
        self._check_model_split()
        if self.seq_len is None:
            # Sequence length shapes activations only, never the checkpoint: shrink divides it too.
            self.seq_len = min(self.shape.max_position_embeddings, max(16, 2048 // self.shrink))
        if self.seq_len > self.shape.max_position_embeddings:
            raise UsageError(
                f"seq_len={self.seq_len} exceeds max_position_embeddings={self.shape.max_position_embeddings}"
            )
        if self.save_interval > self.iters:
            raise UsageError(
                f"save_interval={self.save_interval} is larger than iters={self.iters}: no checkpoint would be "
                "written; accepted: 1 <= save_interval <= iters"
            )
        if self.device == "auto":
            self.device = "cuda" if glob.glob("/dev/nvidia[0-9]*") else "cpu"
        return self

    def _resolve_ranks(self) -> None:
        per_replica = self.tp * self.pp
        if self.dp is None:
            if self.ranks_per_node is None:
                self.dp = 1
            else:
                ranks = self.nodes * self.ranks_per_node
                if ranks % per_replica:
                    raise UsageError(
                        f"nodes x ranks_per_node = {self.nodes} x {self.ranks_per_node} = {ranks} ranks is not "
                        f"a multiple of tp x pp = {self.tp} x {self.pp} = {per_replica}"
                    )
                self.dp = ranks // per_replica
        world = per_replica * self.dp
        if self.ranks_per_node is None:
            if world % self.nodes:
                raise UsageError(
                    f"world size tp x pp x dp = {self.tp} x {self.pp} x {self.dp} = {world} does not split over "
                    f"nodes={self.nodes}"
                )
            self.ranks_per_node = world // self.nodes
        if self.nodes * self.ranks_per_node != world:
            raise UsageError(
                f"dp={self.dp} does not match the ranks: tp x pp x dp = {self.tp} x {self.pp} x {self.dp} = "
                f"{world}, but nodes x ranks_per_node = {self.nodes} x {self.ranks_per_node} = "
                f"{self.nodes * self.ranks_per_node}"
            )

    def _check_model_split(self) -> None:
        s, tp = self.shape, self.tp
        if s.hidden_size % s.num_attention_heads and s.head_dim is None:
            raise UsageError(
                f"hidden_size={s.hidden_size} is not divisible by num_attention_heads={s.num_attention_heads}"
            )
        if s.num_attention_heads % s.num_key_value_heads:
            raise UsageError(
                f"num_attention_heads={s.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={s.num_key_value_heads}"
            )
        if s.dim_per_head % 2:
            raise UsageError(f"head dimension {s.dim_per_head} must be even (rotary embeddings)")
        checks = [
            ("num_attention_heads", s.num_attention_heads),
            ("num_key_value_heads", s.num_key_value_heads),
            ("intermediate_size", s.intermediate_size),
            ("vocab_size", s.vocab_size),
        ]
        for name, value in checks:
            if value % tp:
                hint = ""
                if name == "num_key_value_heads":
                    hint = " (key/value heads are split across TP ranks, not replicated)"
                raise UsageError(f"tp={tp} does not divide {name}={value}{hint}")
        if self.pp > s.num_hidden_layers:
            raise UsageError(
                f"pp={self.pp} is larger than the {s.num_hidden_layers} transformer layers "
                "(each pipeline stage needs at least one)"
            )
