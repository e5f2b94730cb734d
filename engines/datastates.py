"""engine=datastates: DeepSpeed's own DataStatesCheckpointEngine (DataStates-LLM, "lazy asynchronous
checkpointing"), switched on by the `datastates_ckpt` block in ds_config.json. DeepSpeed creates the engine; it is
decoupled: save() returns once the copy is queued and DataStates flushes in the background (see wait_durable for
when it is durable). DataStates-LLM is not on PyPI and its constructor needs CUDA: refused before launch elsewhere."""

from __future__ import annotations

import importlib.util

from restart_harness.errors import UsageError

SAVES = True
INSTALL = ("build and install it from https://github.com/DataStates/datastates-llm (not on PyPI: CMake, the CUDA "
           "toolkit, liburing; then `pip install .` into this Python)")


def check(spec) -> None:
    missing = importlib.util.find_spec("datastates") is None
    if missing or spec.device != "cuda":
        why = []
        if missing:
            why.append("Python module 'datastates' is not installed")
        if spec.device != "cuda":
            why.append(f"it needs a CUDA GPU (device={spec.device})")
        raise UsageError(f"engine=datastates cannot run here: {' and '.join(why)}; {INSTALL}")


def ds_config(spec) -> dict:
    """The datastates_ckpt block DeepSpeed reads (host_cache_size in GB, parser_threads) from the options."""
    return {"datastates_ckpt": {"host_cache_size": spec.engine_options["host_cache_size"],
                                "parser_threads": spec.engine_options["parser_threads"]}}


def make_checkpoint_engine(ds_engine, spec):
    return None  # DeepSpeed built DataStatesCheckpointEngine from the datastates_ckpt block


def wait_durable(checkpoint_engine) -> None:
    """Until DataStates has persisted every queued save. DeepSpeed 0.19.8's DataStatesCheckpointEngine keeps its
    commit info but does not override get_commit_info(), so engine.step() never commits it (only cleanup at exit
    does): the harness's waiter thread waits on DataStates' own wait(persist=True) instead."""
    checkpoint_engine.ckpt_engine.wait(persist=True)
