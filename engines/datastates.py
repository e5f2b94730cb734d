"""engine=datastates: DeepSpeed's own DataStatesCheckpointEngine (DataStates-LLM), switched on by the
`datastates_ckpt` block in ds_config.json; CUDA only. What the harness does that DeepSpeed does not (fsync, commit,
checksums): docs/engines.md#enginedatastates-what-the-harness-does-that-deepspeed-does-not."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

from engines import _datastates_api
from engines.base import CheckpointIO, Engine, EngineContext, NativeIO
from restart_harness.errors import UsageError
from restart_harness.plan.checkpoint import rank_saves
from restart_harness.plugins import NodeCheck
from restart_harness.spec.keys import GIB, key
from third_party.datastates_exit import explained

INSTALL = ("build DataStates-LLM at the commit of scripts/bundle/datastates-llm.pin (not on PyPI; CMake, nanobind, "
           "the CUDA toolkit, liburing): scripts/bundle/install.sh does on a CUDA node, or "
           "scripts/bundle/build-datastates.sh SRC PYTHON")
# the only one of DataStates 1b84990's three engines DeepSpeed 0.19.8 can use (why: the docs named above)
ENGINE_TYPE = "state_engine"
ALIGNMENT = 4096  # DataStates places every tensor of its host cache at a file-system block boundary
CACHE_SLACK_BYTES = 64 << 20  # the pickled remainder's region and the pool's own rounding


@dataclass
class Options:
    host_cache_size: float | None = key(None, "pinned host memory per rank for the device-to-host copies; auto: what "
                                        "the largest rank saves per checkpoint (the planner's bytes, each tensor "
                                        "4 KiB-aligned)", group="checkpoint", unit="GiB", above=0)
    parser_threads: int = key(8, "threads that serialize and write, as DeepSpeed documents the block (DataStates "
                                 "1b84990 reads only host_cache_size, engine_type and profile_engine)",
                              group="checkpoint", minimum=1, maximum=256)


class DataStatesEngine(Engine):
    name = "datastates"
    description = ("DataStates-LLM via DeepSpeed's DataStatesCheckpointEngine - lazy async copy to a host cache, "
                   "flushed in the background (CUDA only)")
    Options = Options
    emulates = False  # DeepSpeed builds the engine from its config inside deepspeed.initialize
    # written region by region after save() returned, never committed by DeepSpeed 0.19.8: checksums (docs above)
    checksums_by_default = True
    # its wait(persist=True) returns once io_uring's writes completed, without an fsync (the docs named above)
    durable_on_wait = False

    def asynchronous(self) -> bool:
        return True  # DeepSpeed's DataStates engine is decoupled

    def check(self) -> None:
        if self.spec.device != "cuda":
            raise UsageError(f"engine=datastates cannot run on device={self.spec.device}: DataStates-LLM needs a CUDA "
                             f"GPU (its constructor exits without one); accepted: device=cuda (on GPU nodes: "
                             f"launcher=slurm|pbs from a login node); {INSTALL}")

    def node_checks(self) -> list[NodeCheck]:
        return [NodeCheck("engine=datastates", "Python module 'datastates' (DataStates-LLM) importable, built, with "
                                               "the API DeepSpeed 0.19.8 calls", installed_shortfall)]

    def host_cache_bytes(self) -> int:
        """The pinned host cache each rank asks DataStates for: host_cache_size, or (auto) the largest rank's save
        with each tensor's alignment and some slack, in whole MiB."""
        if self.options.host_cache_size is not None:
            return int(self.options.host_cache_size * GIB)
        need = max((b + t * ALIGNMENT for b, t in rank_saves(self.spec, self.files()).values()), default=0) + CACHE_SLACK_BYTES
        return math.ceil(need / 2**20) * 2**20

    def ds_config(self) -> dict:
        """The datastates_ckpt block DeepSpeed hands DataStates: host_cache_size in GB (DataStates multiplies by
        2^30 and takes fractions), the engine type, parser_threads."""
        return {"datastates_ckpt": {"host_cache_size": self.host_cache_bytes() / 2**30, "engine_type": ENGINE_TYPE,
                                    "parser_threads": self.options.parser_threads}}

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return DataStatesIO(ctx.native, ctx.target, self.host_cache_bytes())


def installed_shortfall() -> str | None:
    """Why this node's DataStates-LLM cannot serve DeepSpeed 0.19.8: not installed, installed without its compiled
    core, or an API DeepSpeed does not call (the repository's 2024 sources; ebc6762's load); None when it can. Read
    from the installed package's sources (importing it needs CUDA's libraries): engines/_datastates_api.py."""
    if (spec := importlib.util.find_spec("datastates")) is None:
        return f"Python module 'datastates' is not installed; {INSTALL}"
    locations = list(spec.submodule_search_locations or [])
    package = Path(locations[0]) if locations else Path(spec.origin or ".").parent
    try:
        _datastates_api.check(package, ENGINE_TYPE)
    except ValueError as exc:
        return f"the installed DataStates-LLM ({package}) is not the one DeepSpeed 0.19.8 can use: {exc}; {INSTALL}"
    if not any(package.glob("datastates_core*.so")):
        return (f"the installed DataStates-LLM ({package}) has no compiled core (datastates_core*.so: its CMake build "
                f"did not run or was not installed there); {INSTALL}")
    return None


def tensor_bytes(state) -> int:
    """The bytes of every distinct storage under the tensors of a (nested) state (a view keeps its whole buffer)."""
    import torch

    storages: dict[int, int] = {}  # data_ptr -> nbytes

    def walk(x) -> None:
        if isinstance(x, torch.Tensor):
            storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        elif isinstance(x, (dict, list, tuple)):
            for v in x.values() if isinstance(x, dict) else x:
                walk(v)

    walk(state)
    return sum(storages.values())


class DataStatesIO(NativeIO):
    """DeepSpeed's DataStatesCheckpointEngine; its pinned host cache and the restore buffers it keeps are counted."""

    def __init__(self, native, target, host_cache_bytes: int):
        super().__init__(native, target)
        self.host_cache_bytes = host_cache_bytes
        # DataStates 1b84990's restore keeps a host copy of every tensor it read, for the life of the engine (docs
        # named above: restore copies); counted until DataStates frees them (a restart's peak RSS then drops)
        self.restored_bytes = 0

    def save(self, state, path):
        with explained():
            return super().save(state, path)

    def load(self, path, map_location=None, into=None):
        with explained():
            state = super().load(path, map_location=map_location)
        self.restored_bytes += tensor_bytes(state)
        return state

    def wait(self) -> None:
        """Until DataStates' own wait(persist=True) returns: every queued copy and io_uring write completed (not
        fsync'd: the harness does that next). DeepSpeed 0.19.8's DataStatesCheckpointEngine does not override
        get_commit_info(), so engine.step() never commits it (only cleanup at exit does): the harness waits here."""
        with explained():
            self.native.ckpt_engine.wait(persist=True)

    def buffers(self) -> dict:
        """The pinned host cache (page-locked with cudaHostRegister when DataStates starts) and the restore copies
        its loads keep."""
        return {"host_bytes": self.host_cache_bytes + self.restored_bytes, "pinned_bytes": self.host_cache_bytes,
                "restore_kept_bytes": self.restored_bytes}

    def load_statistics(self) -> dict:
        """After the restart's load: the host copies DataStates keeps of what it read, and its pinned cache."""
        return {"restore_kept_bytes": self.restored_bytes, "host_cache_bytes": self.host_cache_bytes}
