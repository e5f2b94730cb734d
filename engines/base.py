"""The interface between the harness and a checkpoint engine. Every engine is one module in engines/ holding one
subclass of Engine; everything the harness asks of an engine has an explicit default here, so a plug-in states only
where it differs. Options are a dataclass of declared keys (restart_harness/spec/keys.py): they appear in --help,
are parsed by the one coercion path, and reach the engine typed (self.options).

Plug-ins import torch and deepspeed inside methods only: the command line imports every engine to validate and to
print --help. DeepSpeed's save_checkpoint / load_checkpoint drive whichever CheckpointEngine is installed, so file
names and the split of state over files stay DeepSpeed's unless an engine says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class NoOptions:
    """An engine without options."""


class Engine:
    """One checkpoint engine, constructed for one resolved RunSpec."""

    name: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type] = NoOptions  # dataclass of key() fields
    saves: ClassVar[bool] = True  # False: the training-step baseline, writes no checkpoint
    # True: the files are DeepSpeed's torch.save files, whose names the planner predicts exactly. False: the engine
    # writes its own layout (e.g. a directory of shards per DeepSpeed file) and the plan gives sizes only.
    planned_names: ClassVar[bool] = False
    # How a restart at another layout reads this engine's checkpoint: "universal" (DeepSpeed's ds_to_universal
    # conversion of torch.save files), or None (it cannot).
    reshard: ClassVar[str | None] = None
    # emulate=true can write this engine's files without DeepSpeed building the engine (engines DeepSpeed creates
    # from its own config inside deepspeed.initialize cannot be emulated).
    emulates: ClassVar[bool] = True
    # The training stacks (RunSpec.stack) the engine checkpoints. stack=fsdp2 saves the whole FSDP2 state with one
    # collective call per checkpoint: an engine listing it provides fsdp2_checkpoint_engine().
    stacks: ClassVar[tuple[str, ...]] = ("deepspeed",)
    # ckpt_dir=s3://... : the engine writes and reads objects through s3torchconnector (docs/s3.md). The worker
    # sets `store` (restart_harness/storage/s3.py ObjectStore) before asking for the checkpoint engine.
    s3: ClassVar[bool] = False
    store: Any = None

    def __init__(self, spec: Any):
        self.spec = spec
        self.options = self.Options(**spec.engine_options)

    def is_async(self) -> bool:
        """save() returns before the files are written; the harness then waits for durability in the background."""
        return False

    def check(self) -> None:
        """Raise UsageError (one line) when the engine cannot run for this spec on this machine. Called before
        anything is created."""

    def ds_config(self) -> dict:
        """Block merged into ds_config.json (e.g. datastates_ckpt, checkpoint.writer)."""
        return {}

    def checkpoint_engine(self, ds_engine: Any) -> Any:
        """The deepspeed CheckpointEngine to install on the DeepSpeed engine, or None to keep DeepSpeed's own."""
        return None

    def fsdp2_checkpoint_engine(self) -> Any:
        """stack=fsdp2: the object that saves and loads the state dict of get_state_dict (model and optimizer,
        sharded) at a path: save(state, path) -> this rank's files, load(path) (into self.template, in place),
        wait() for async saves. Only engines whose `stacks` name fsdp2."""
        raise NotImplementedError(f"engine {self.name} does not checkpoint stack=fsdp2")

    def wait_durable(self, checkpoint_engine: Any) -> None:
        """Block until the engine's last save has finished writing (async engines); the harness fsyncs after."""

    def emulation_engine(self) -> Any:
        """The CheckpointEngine an emulated rank saves and loads through: the plug-in's own, else DeepSpeed's
        TorchCheckpointEngine with the zip serialization DeepSpeed configures by default."""
        engine = self.checkpoint_engine(None)
        if engine is not None:
            return engine
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
        from deepspeed.runtime.model_checkpointing.constants import CHECKPOINT_SERIALIZATION_DEFAULT

        engine = TorchCheckpointEngine()
        engine.zipfile_serialization = CHECKPOINT_SERIALIZATION_DEFAULT
        return engine


def engine_options_of(cls: type[Engine]) -> dict:
    """Default option values of an engine, as a plain dict (what spec.json stores)."""
    from dataclasses import asdict

    return asdict(cls.Options())
