"""engine=datastates: DeepSpeed's own DataStatesCheckpointEngine (DataStates-LLM, "lazy asynchronous
checkpointing"), switched on by the `datastates_ckpt` block in ds_config.json. DeepSpeed creates the engine; it is
decoupled: save() returns once the copy is queued and DataStates flushes in the background (see DataStatesIO.wait for
when it is durable). The harness commits its checkpoints (DeepSpeed 0.19.8 does not) and takes their checksums
(checksums=auto), so a torn file fails the restart before it loads. DataStates-LLM is not on PyPI and its
constructor needs CUDA: refused before launch elsewhere (docs/engines.md)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from engines.base import CheckpointIO, Engine, EngineContext, NativeIO
from restart_harness.errors import UsageError
from restart_harness.plugins import NodeCheck
from restart_harness.spec.keys import key

INSTALL = ("build it from https://github.com/DataStates/datastates-llm at the commit of "
           "scripts/bundle/datastates-llm.pin (not on PyPI; CMake, nanobind, the CUDA toolkit, liburing), which "
           "scripts/bundle/install.sh does on a CUDA node")


@dataclass
class Options:
    host_cache_size: int = key(16, "pinned host memory per rank for the device-to-host copies",
                               group="checkpoint", unit="GB", minimum=1)
    parser_threads: int = key(8, "threads that serialize and write", group="checkpoint", minimum=1, maximum=256)


class DataStatesEngine(Engine):
    name = "datastates"
    description = ("DataStates-LLM via DeepSpeed's DataStatesCheckpointEngine - lazy async copy to a host cache, "
                   "flushed in the background (CUDA only)")
    Options = Options
    emulates = False  # DeepSpeed builds the engine from its config inside deepspeed.initialize
    # DataStates writes each file's regions from its flush threads after save() returned, and DeepSpeed 0.19.8
    # never commits this engine: the harness commits it, and takes each file's checksum to check before a restart
    checksums_by_default = True

    def asynchronous(self) -> bool:
        return True  # DeepSpeed's DataStates engine is decoupled

    def check(self) -> None:
        if self.spec.device != "cuda":
            raise UsageError(f"engine=datastates cannot run on device={self.spec.device}: DataStates-LLM needs a CUDA "
                             f"GPU (its constructor exits without one); accepted: device=cuda (on GPU nodes: "
                             f"launcher=slurm|pbs from a login node); {INSTALL}")

    def node_checks(self) -> list[NodeCheck]:
        def module() -> str | None:
            if importlib.util.find_spec("datastates") is None:
                return f"Python module 'datastates' is not installed; {INSTALL}"
            return None

        return [NodeCheck("engine=datastates", "Python module 'datastates' (DataStates-LLM) importable", module)]

    def ds_config(self) -> dict:
        """The datastates_ckpt block DeepSpeed reads (host_cache_size in GB, parser_threads)."""
        return {"datastates_ckpt": {"host_cache_size": self.options.host_cache_size,
                                    "parser_threads": self.options.parser_threads}}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return DataStatesIO(ctx.native, ctx.target)


class DataStatesIO(NativeIO):
    def wait(self) -> None:
        """Until DataStates has persisted every queued save. DeepSpeed 0.19.8's DataStatesCheckpointEngine keeps its
        commit info but does not override get_commit_info(), so engine.step() never commits it (only cleanup at exit
        does): the harness waits on DataStates' own wait(persist=True) instead."""
        self.native.ckpt_engine.wait(persist=True)
