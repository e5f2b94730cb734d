"""The interface between the harness and a training stack: what trains the model and holds the state a checkpoint
saves (DeepSpeed, FSDP2, the emulated stack that writes DeepSpeed's files without training). One module in
restart_harness/stacks/ per stack, holding one subclass of Stack.

The class answers the command line (no torch): its capabilities, its default engine, which layouts and engines it
takes (check), and how a restart at another layout works (check_relayout, relayout). An instance is one rank of a
phase, driven by the one rank loop (restart_harness/worker/main.py) and its checkpoint manager
(worker/manager.py): start, build, then train steps, saves and loads through the manager's recorder, verification.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from restart_harness.errors import UsageError
from restart_harness.rank_env import all_reduce


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
    """A training stack; an instance is one rank of one phase."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_engine: ClassVar[str]
    # how a restart at another layout reads the checkpoint: "convert" (a conversion before the launch, relayout()),
    # "native" (the stack's own loader reshards), or None (it cannot)
    reshard: ClassVar[str | None] = None
    planned: ClassVar[bool] = False  # the planner (restart_harness/plan/) predicts its files exactly
    # its whole sharded state is saved by one collective call per checkpoint (FSDP2 + DCP), not file by file
    collective: ClassVar[bool] = False
    trains: ClassVar[bool] = True  # False: no model, no steps (emulation): one save, or one load
    target_kinds: ClassVar[tuple[str, ...]] = ("posix", "object")  # storage target kinds it can work on
    # categories of a save's / a load's time that are not part of it (data generation, waiting for another wave of
    # ranks, verification between loads): excluded from its seconds and from its anatomy
    save_untimed: ClassVar[tuple[str, ...]] = ()
    load_untimed: ClassVar[tuple[str, ...]] = ()
    # how refusals name the stack: the key that selects it, and the way back to the others
    key_text: ClassVar[str] = ""
    key_text_off: ClassVar[str] = "another stack="
    engine_refusal: ClassVar[str] = ("engine={engine} does not checkpoint stack={stack}; accepted with stack={stack}: "
                                     "engine={takers}")

    # ---- the command line (no torch) ------------------------------------------------------------------------------
    @classmethod
    def accepts_engine(cls, engine: type) -> bool:
        return cls.name in engine.stacks

    @classmethod
    def check(cls, spec) -> None:
        """Raise UsageError (one line) for keys or layouts this stack cannot take."""

    @classmethod
    def check_relayout(cls, original, spec, engine: type, target: type, saves: list[dict]) -> None:
        """Raise UsageError when a checkpoint of `original` cannot be restarted at spec's layout (saves: the
        checkpoint's save events)."""
        if cls.reshard is None:
            raise UsageError(f"restart at another layout ({original.layout} -> {spec.layout}): {cls.key_text} "
                             "cannot reshard its checkpoints; accepted: a restart at its own layout")

    @classmethod
    def relayout(cls, run, original, tag: str, say) -> Relayout:
        """Prepare a restart of `run`'s checkpoint `tag` (saved at original's layout) at run.spec's layout."""
        return Relayout()

    # ---- one rank -------------------------------------------------------------------------------------------------
    @classmethod
    def imports(cls) -> None:
        """Import the libraries a rank of this stack needs (the restart's `imports` phase holds them)."""
        import torch  # noqa: F401

    # Modules a rank imports later, inside its set-up (torch.optim's first optimizer imports torch._dynamo): a
    # launcher that forks its ranks from one process imports them before it forks (worker/forker.py)
    later_imports: ClassVar[tuple[str, ...]] = ("torch._dynamo",)

    def __init__(self, run, rank: int, log):
        self.run, self.spec, self.rank, self.log = run, run.spec, rank, log
        self.device: Any = None

    @abstractmethod
    def start(self) -> None:
        """Join the process group; set self.device."""

    @abstractmethod
    def build(self) -> None:
        """The model, optimizer and training engine (a stack that builds a model marks `model_built`)."""

    def hook(self, anatomy) -> None:
        """Attribute the stack's collectives (wait) and state copies (copy) to the anatomy's regions."""

    def engine_context(self) -> dict:
        """What the checkpoint engine is opened with beside the spec and the target (engines/base.py EngineContext):
        native, training."""
        return {}

    def attach(self, recorder) -> None:
        """Route the stack's own checkpoint calls (DeepSpeed's) to the manager's recorder."""

    def client_state(self, step: int) -> dict:
        """What every checkpoint carries beside the training state."""
        return {"harness_step": step}

    def save_facts(self) -> dict:
        """Fields the stack adds to each save record."""
        return {}

    @abstractmethod
    def save(self, root: Path, tag: str, client_state: dict, io, untimed) -> None:
        """Write one checkpoint under root/tag through `io` (the manager's recorder); `untimed(category)`: a context
        for time inside the save that is not part of it."""

    @abstractmethod
    def load(self, root: Path, tag: str, io, untimed) -> dict:
        """Load root/tag through `io`; returns the client state saved with it (raises when nothing was loaded)."""

    def commit_pending(self) -> None:
        """An engine DeepSpeed commits itself (engines' committed_by_deepspeed): commit the pending save now, as the
        next training step would."""

    def train_step(self, step: int) -> float:
        raise NotImplementedError(f"stack {self.name} does not train")

    @abstractmethod
    def record_digests(self, tag: str) -> int:
        """Before a save: digest the state about to be saved (digests/<tag>/); returns the tensors digested."""

    @abstractmethod
    def verify(self, tag: str, reference: Path | None) -> Verification:
        """After a load: the restored state against the digests taken at save (or against `reference`)."""

    @abstractmethod
    def layout(self) -> dict:
        """This rank's place: dp_rank, tp_rank, pp_rank, device, local_parameters (the `layout` event)."""

    # the collectives the checkpoint manager needs, on the default process group every stack here joins
    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def all_true(self, flag: bool) -> bool:
        """A collective: True when flag is True on every rank."""
        return bool(all_reduce([1.0 if flag else 0.0], "min", device=self.device)[0])

    def max_of(self, value: float) -> float:
        """A collective: the largest value over the ranks."""
        return all_reduce([value], "max", device=self.device)[0]

    def sync(self) -> None:
        """Wait for queued device work (a timer that stops while it is queued measures nothing): CUDA only."""
        if self.device is not None and self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def finish(self) -> None:
        """The phase is over on this rank (after the last save is committed)."""
        self.barrier()

    # ---- shared by the stacks: digests on disk -------------------------------------------------------------------
    def digest_path(self, tag: str, rank: int | None = None) -> Path:
        rank = self.rank if rank is None else rank
        return self.run.run_dir / "digests" / tag / f"rank-{rank:05d}.json"

    def write_digests(self, tag: str, digests: dict[str, str]) -> None:
        from restart_harness.files.atomic import write_json_atomic
        from restart_harness.model import digest

        path = self.digest_path(tag)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"tag": tag, "rank": self.rank, "combined": digest.combined(digests),
                                 "tensors": digests})

    def compare(self, tag: str, restored: dict[str, str], saved_by: int, started: float,
                full_state: bool = False) -> Verification:
        """restored against the digests rank `saved_by` recorded at save."""
        from restart_harness.model import digest

        path = self.digest_path(tag, saved_by)
        saved = json.loads(path.read_text())["tensors"] if path.is_file() else {}
        diff = digest.differences(saved, restored) if saved else ["<no digest recorded at save>"]
        return Verification(tag, not diff, diff, len(restored), time.perf_counter() - started, full_state)
