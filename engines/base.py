"""The interface between the harness and a checkpoint engine: Engine (the plug-in: options, capabilities, checks),
FileLayout (what the planner needs), CheckpointIO (a rank's saves and loads) and EngineRecords (what the results make
of its statistics). Every member, its default and what the harness does with it:
docs/engines.md#the-interface-and-adding-an-engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from restart_harness.errors import UsageError
from restart_harness.plugins import NodeCheck
from restart_harness.spec.runspec import RunSpec
from restart_harness.targets.base import Store


@dataclass
class NoOptions:
    """An engine without options."""


@dataclass(frozen=True)
class EngineContext:
    """What a rank hands its engine when it opens it (after the training stack is built)."""

    spec: RunSpec
    target: Store  # the placed storage target's rank-side view (restart_harness/targets/): streams, DCP, paths
    # one collective save of the whole sharded state per checkpoint (FSDP2 + DCP), not one per file (DeepSpeed)
    collective: bool = False
    # the checkpoint engine DeepSpeed built from ds_config.json (an emulated rank: its TorchCheckpointEngine), or None
    native: Any = None
    training: Any = None  # the DeepSpeed engine, where the stack is DeepSpeed's (engine=lazy hooks its step)
    # the run's storage probe (run_dir/baseline.json, files/baseline.py), or None (baseline=false, or no probe ran)
    storage: dict | None = None


class CheckpointIO(ABC):
    """One rank's reads and writes of checkpoint files for one engine."""

    # the DeepSpeed-built engine it delegates to (DeepSpeed keeps its create/commit lifecycle); None for ours
    native: Any = None

    @abstractmethod
    def save(self, state: Any, path: str) -> list[str]:
        """Write `state` at `path` (a file, or a folder of shards); return the paths this rank wrote there (usually
        [path]; a share of a file split over ranks names only its own parts; [] when another rank writes it)."""

    @abstractmethod
    def load(self, path: str, map_location: Any = None, into: Any = None) -> Any:
        """The state saved at `path`; `into`: a state dict of the right shapes to load into in place (DCP)."""

    def read_path(self, path: str) -> str:
        """The file a load of `path` reads (an engine that stores a file under a name of its own says which)."""
        return path

    def wait(self) -> None:
        """Until every save so far is written (an asynchronous engine's flush); the harness makes it durable after."""

    def buffers(self) -> dict | None:
        """The host memory this engine holds for checkpointing now, by its own count: {"host_bytes": ..., "pinned_bytes":
        ...} (pinned: page-locked, of host_bytes), or None for an engine that keeps none between saves; asked when
        a save returns (docs/measurements.md#memory-per-save)."""
        return None

    def load_statistics(self) -> dict | None:
        """The engine's own account of this rank's restart load (asked once, after it), or None."""
        return None

    def statistics(self) -> dict | None:
        """The engine's account of the save since the last call (and its flush), or None; asked once it is durable."""
        return None

    # DeepSpeed's questions to its checkpoint engine, with DeepSpeed's own answers by default
    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        """Does this data-parallel rank write the files DeepSpeed has one replica write (model states)?"""
        return dp_rank == 0

    def preserves_storage_sharing(self) -> bool:
        """False: the engine writes each view's own elements, so DeepSpeed need not clone tensors before saving."""
        return True


class NativeIO(CheckpointIO):
    """The checkpoint engine DeepSpeed built (or would build), used as it is, through the target's destination
    (torch.save and torch.load take the path itself, or the object store's stream)."""

    def __init__(self, native: Any, target: Any):
        self.native, self.target = native, target

    def save(self, state, path):
        with self.target.destination(path, "wb") as dest:
            self.native.save(state, dest)
        return [path]

    def load(self, path, map_location=None, into=None):
        with self.target.destination(path, "rb") as source:
            return self.native.load(source, map_location=map_location)

    def is_data_parallel_writer(self, dp_rank):
        return self.native.is_data_parallel_writer(dp_rank)

    def preserves_storage_sharing(self):
        return self.native.preserves_storage_sharing()


class FileLayout:
    """What the planner (restart_harness/plan/checkpoint.py) needs of an engine: the files it stores for each of
    DeepSpeed's, and how much of each a restarting rank reads. By default DeepSpeed's own files, written by DeepSpeed's
    writer and read whole by every rank that loads them."""

    def __init__(self, spec: RunSpec, options: Any):
        self.spec, self.options = spec, options

    def stored(self, recipe: Any, rank_of: Any) -> list[tuple[str, int]]:
        """The files this engine writes for one of DeepSpeed's (a plan/checkpoint.py FileRecipe), each with the global
        rank writing it; rank_of(dp_rank) is the global rank at the recipe's pipeline stage and TP rank and that
        data-parallel rank. A load of a DeepSpeed file reads the first of the files returned for it
        (CheckpointIO.read_path)."""
        return [(recipe.path, recipe.writer)]

    def restart_read_bytes(self, path: str, nbytes: int, dp_rank: int) -> int:
        """How many of the `nbytes` of the file at `path` a rank at data-parallel index dp_rank reads from storage
        when its restart loads it. By default all of them: every rank reads what it loads."""
        return nbytes


class EngineRecords:
    """What the results make of an engine's own statistics (CheckpointIO.statistics and load_statistics, as the
    checkpoint record holds them): its summary entry and its terminal rows, so no other module knows its keys. By
    default none."""

    @staticmethod
    def staging(record: dict[int, list[dict]]) -> dict | None:
        """summary.json's checkpoint.engine_staging, of the checkpoint record (rank -> events): how the engine sized
        its host buffers, or None."""
        return None

    @staticmethod
    def memory_rows(staging: dict) -> list[tuple[str, str]]:
        """Terminal rows under the save memory, of checkpoint.engine_staging."""
        return []

    @staticmethod
    def restart_rows(load_statistics: dict) -> list[tuple[str, str]]:
        """Terminal rows of a restart's engine_load_statistics (summed over ranks: results/summary.py)."""
        return []


class Engine(ABC):
    """One checkpoint engine, constructed for one RunSpec (restart_harness/resolve.py); self.options typed."""

    # each member's meaning and what the harness does with it: docs/engines.md#the-interface-and-adding-an-engine
    name: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type] = NoOptions  # dataclass of key() fields
    saves: ClassVar[bool] = True  # False: the training-step baseline, writes no checkpoint
    planned_names: ClassVar[bool] = False  # True: DeepSpeed's torch.save files, named exactly by the planner
    universal: ClassVar[bool] = False  # DeepSpeed's universal-checkpoint converter reads its files
    emulates: ClassVar[bool] = True  # emulate=true can write its files without DeepSpeed building the engine
    stacks: ClassVar[tuple[str, ...]] = ("deepspeed",)  # the training stacks (restart_harness/stacks/) it checkpoints
    target_kinds: ClassVar[tuple[str, ...]] = ("posix",)  # the kinds of storage target it writes to (targets/base.py)
    committed_by_deepspeed: ClassVar[bool] = False  # DeepSpeed's decoupled writer commits a save in the next step
    checksums_by_default: ClassVar[bool] = False  # checksums=auto takes content checksums of its files
    fault_point: ClassVar[str] = "save"  # where RH_FAULT kills a rank inside its save (restart_harness/faults.py)
    file_layout: ClassVar[type[FileLayout]] = FileLayout  # what the planner asks (files())
    records: ClassVar[type[EngineRecords]] = EngineRecords  # what the results make of its own statistics
    # True: once its save (synchronous) or wait() (asynchronous) returns, the engine has fsync'd its files itself;
    # the harness fsyncs every engine's files inside the save's window either way, and records which did
    durable_on_wait: ClassVar[bool] = False

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.options = self.Options(**spec.engine_options)

    def checksums(self, target: Any) -> bool:
        """Does each rank take the checksums of its files once a save is committed (key checksums=), on `target`?"""
        wanted = self.spec.checksums == "on" or (self.spec.checksums == "auto" and self.checksums_by_default)
        return wanted and not target.no_checksums

    def asynchronous(self) -> bool:
        """save() returns before the files are written; the harness then waits for durability in the background."""
        return False

    def host_buffer_bytes(self, rank_bytes: int) -> int:
        """Host memory a rank's engine holds beside the training state while it saves or loads `rank_bytes` of
        checkpoint (its staging and I/O buffers): what preflight.resources adds to each rank's need."""
        return 0

    def check(self) -> None:
        """Raise UsageError (one line) when the engine cannot run for this spec, whatever the node: its keys, the
        layout, the device asked for. Called before anything is created, on the machine the command is typed on."""

    def node_checks(self) -> list[NodeCheck]:
        """What the engine needs of the node that runs its ranks (a module, an op's headers, locked memory): checked
        there before any rank starts (restart_harness/nodecheck.py), here where the ranks start here."""
        return []

    def prepare(self) -> None:
        """In each rank, before the training stack is built: what must be in place before DeepSpeed creates the
        engine from ds_config.json (a dependency's work-around from third_party/)."""

    def files(self) -> FileLayout:
        """The planner's view of this engine: how it stores DeepSpeed's files."""
        return self.file_layout(self.spec, self.options)

    def ds_config(self) -> dict:
        """Block merged into ds_config.json (e.g. datastates_ckpt, checkpoint.writer)."""
        return {}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        """This rank's CheckpointIO. By default DeepSpeed's own checkpoint engine (ctx.native), as DeepSpeed uses it."""
        if ctx.native is None:
            raise UsageError(f"engine={self.name} saves through DeepSpeed's checkpoint engine, which the training "
                             f"stack does not have; accepted stacks: {', '.join(self.stacks)}")
        return NativeIO(ctx.native, ctx.target)
