"""The interface between the harness and a training stack (DeepSpeed, FSDP2, the emulated stack): Stack, the kind for
the command line (no torch), and Rank (Stack.Rank), one rank of a phase driven by the rank loop
(restart_harness/worker/main.py) and its checkpoint manager (worker/manager.py). docs/architecture.md."""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from restart_harness.errors import UsageError
from restart_harness.files.atomic import write_json_atomic


@dataclass(frozen=True)
class Verification:
    """A restored state checked against what was saved (the `verify` event)."""

    tag: str
    ok: bool
    differing: list[str]
    tensors: int
    seconds: float
    full_state: bool = False  # every parameter's full, unsplit state (any layout), not this rank's own tensors

    def event(self) -> dict:
        return {"tag": self.tag, "ok": self.ok, "differing": self.differing[:50],
                "differing_count": len(self.differing), "tensors": self.tensors, "seconds": self.seconds,
                **({"full_state": True} if self.full_state else {})}


@dataclass(frozen=True)
class Relayout:
    """How a restart at another layout reads a checkpoint: what its ranks load and check against."""

    load_tag: str | None = None  # the tag to load (a converted copy), else the committed one
    reference: Path | None = None  # full-state digests of the saved checkpoint to verify against
    conversion: dict | None = None  # the conversion's record (seconds, bytes), when one ran
    ds_config: dict = field(default_factory=dict)  # merged into the restart's own ds_config.json
    load_dir: Path | None = None  # what the restart reads (the page-cache step acts on it); None: the tag itself

    def worker_args(self) -> list[str]:
        args = ["--load-tag", self.load_tag] if self.load_tag else []
        return args + (["--full-state-reference", str(self.reference)] if self.reference else [])


class Stack(ABC):
    """A training stack's kind, for the command line (no torch): its capabilities, checks and a restart at another
    layout. Never instantiated: its Rank is one rank of a phase."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_engine: ClassVar[str]
    key_text: ClassVar[str] = ""  # how refusals name the stack: the key that selects it
    planned: ClassVar[bool] = False  # the planner (restart_harness/plan/) predicts its files exactly
    trains: ClassVar[bool] = True  # False: no model, no steps (emulation): one save, or one load
    Rank: ClassVar[type[Rank]]  # one rank of a phase

    @classmethod
    def accepts_engine(cls, engine: type) -> bool:
        return cls.name in engine.stacks

    @classmethod
    def check(cls, spec, engine: type, target: type) -> None:
        """Raise UsageError (one line) for keys, layouts, an engine class or a target class this stack cannot take."""

    @classmethod
    def check_relayout(cls, original, spec, engine: type, target: type, saves: list[dict]) -> None:
        """Raise UsageError when a checkpoint of `original` cannot be restarted at spec's layout (saves: the
        checkpoint's save events). By default a stack cannot: one that can reshard says so here (and converts in
        relayout(), or its loader reshards)."""
        raise UsageError(f"restart at another layout ({original.layout} -> {spec.layout}): {cls.key_text} "
                         "cannot reshard its checkpoints; accepted: a restart at its own layout")

    @classmethod
    def relayout(cls, run, original, tag: str, say) -> Relayout:
        """Prepare a restart of `run`'s checkpoint `tag` (saved at original's layout) at run.spec's layout."""
        return Relayout()

    @classmethod
    def imports(cls, later: bool = False) -> None:
        """Import the libraries a rank of this stack needs (the restart's `imports` phase holds them); later=True:
        also those a rank imports inside its set-up (torch.optim's first optimizer imports torch._dynamo), which a
        launcher that forks its ranks from one process imports before it forks (worker/forker.py)."""
        import torch

        if later:
            import torch._dynamo  # noqa: F401


class Rank(ABC):
    """One rank of a phase of a training stack, driven by the one rank loop (worker/main.py) and its checkpoint
    manager (worker/manager.py)."""

    # categories of a save's / a load's time that are not part of it (data generation, waiting for another wave of
    # ranks, verification between loads): excluded from its seconds and from its anatomy
    untimed: ClassVar[dict[str, tuple[str, ...]]] = {"save": (), "load": ()}

    def __init__(self, run, rank: int, log):
        self.run, self.spec, self.rank, self.log = run, run.spec, rank, log
        self.device: Any = None

    @abstractmethod
    def start(self) -> None:
        """Join the process group; set self.device."""

    @abstractmethod
    def build(self) -> dict:
        """The model, optimizer and training engine (a stack that builds a model marks `model_built`); returns this
        rank's place: dp_rank, tp_rank, pp_rank, device, local_parameters (the `layout` event)."""

    def hook(self, anatomy) -> None:
        """Attribute the stack's collectives (wait) and state copies (copy) to the anatomy's regions."""

    def engine_context(self) -> dict:
        """What the checkpoint engine is opened with beside the spec and the target (engines/base.py EngineContext):
        native, training, collective (the whole sharded state saved by one collective call per checkpoint)."""
        return {}

    def attach(self, recorder) -> None:
        """Route the stack's own checkpoint calls (DeepSpeed's) to the manager's recorder."""

    @abstractmethod
    def save(self, root: Path, tag: str, step: int, io, untimed) -> dict:
        """Write one checkpoint of the state after `step` under root/tag through `io` (the manager's recorder);
        `untimed(category)`: a context for time inside the save that is not part of it. Returns the fields the stack
        adds to the save record."""

    @abstractmethod
    def load(self, root: Path, tag: str, io, untimed) -> dict:
        """Load root/tag through `io`; returns the client state saved with it (raises when nothing was loaded)."""

    def commit_pending(self) -> None:
        """An engine DeepSpeed commits itself (engines' committed_by_deepspeed): commit the pending save now, as the
        next training step would."""

    def train_step(self, step: int) -> float:
        raise NotImplementedError(f"stack {self.run.stack.name} does not train")

    @abstractmethod
    def record_digests(self, tag: str) -> int | None:
        """Before a save: digest the state about to be saved (digests/<tag>/); returns the tensors digested."""

    @abstractmethod
    def verify(self, tag: str, reference: Path | None) -> Verification:
        """After a load: the restored state against the digests taken at save (or against `reference`)."""


# ---- shared by the stacks: digests on disk -----------------------------------------------------------------------
def digest_path(rank: Rank, tag: str, saved_by: int) -> Path:
    return rank.run.run_dir / "digests" / tag / f"rank-{saved_by:05d}.json"


def write_digests(rank: Rank, tag: str, digests: dict[str, str]) -> int:
    """The digests' file (returns how many), written and made durable (two fsyncs) by a thread beside training, not
    in the seconds training waits; digests_written() waits for it (the manager before it commits the save)."""
    from restart_harness.model import digest

    digests_written(rank)
    path = digest_path(rank, tag, rank.rank)
    record = {"tag": tag, "rank": rank.rank, "combined": digest.combined(digests), "tensors": digests}

    def write() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, record)
        except OSError as exc:
            rank._digest_error = exc

    rank._digest_writer = threading.Thread(target=write, name=f"digests-{tag}", daemon=True)
    rank._digest_writer.start()
    return len(digests)


def digests_written(rank: Rank) -> None:
    """Wait for the rank's last digests' file (write_digests' thread); its error, if any, raised here."""
    writer, rank._digest_writer = getattr(rank, "_digest_writer", None), None
    if writer is not None:
        writer.join()
    error, rank._digest_error = getattr(rank, "_digest_error", None), None
    if error is not None:
        raise error


def compare(rank: Rank, tag: str, restored: dict[str, str], saved_by: int, started: float,
            full_state: bool = False) -> Verification:
    """restored against the digests rank `saved_by` recorded at save."""
    from restart_harness.model import digest

    path = digest_path(rank, tag, saved_by)
    saved = json.loads(path.read_text())["tensors"] if path.is_file() else {}
    diff = digest.differences(saved, restored) if saved else ["<no digest recorded at save>"]
    return Verification(tag, not diff, diff, len(restored), time.perf_counter() - started, full_state)
