"""torchsnapshot 0.1.0 shims for per-rank snapshots inside a DeepSpeed job. Applied by engines/torchsnapshot.py.

1. single_process(): with torch.distributed initialized, `PGWrapper(pg=None)` uses WORLD, so a Snapshot is one
   collective: rank 0's path wins and replicated entries are de-duplicated across ranks. DeepSpeed wants every
   rank to write its own, distinct state dict at its own path. While the context is active, `PGWrapper(None)`
   acts as a single-process group (no collectives, rank 0 of 1), exactly as torchsnapshot behaves without
   torch.distributed. Passing a size-1 subgroup does not work instead (torchsnapshot broadcasts with a global
   src rank). Remove when torchsnapshot gains a no-collectives option: check with
   tests/test_engines.py::test_torchsnapshot_shims_still_needed, which asserts PGWrapper(None).pg is WORLD with a
   process group initialized. async_take's background thread runs after the block has ended, but it only uses
   the rank (0) and world size (1) captured inside it, so it stays single-process too.

2. async_private_copy(): in 0.1.0, TensorBufferStager._should_copy_cpu_tensor compares the entry's serializer
   (a str) with the Serializer enum, which is never equal, so async_take does NOT copy CPU tensors before
   returning: the background write reads live tensors that the next optimizer step overwrites. The prepare
   function below gives each CPU tensor a private copy at staging time (inside async_take). Remove when
   `TensorBufferStager(t, entry_with_serializer="buffer_protocol", is_async_snapshot=True, ...)
   ._should_copy_cpu_tensor()` returns True (tests/test_engines.py checks that it still returns False).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

ADDRESSES = "torchsnapshot==0.1.0"
_lock = threading.Lock()


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """PGWrapper(pg=None) means 'this process alone' while inside the block (patched on the class, restored after)."""
    from torchsnapshot import pg_wrapper

    with _lock:
        original = pg_wrapper.PGWrapper.__init__

        def init(self, pg=None) -> None:
            self.pg = pg  # None stays None: no fallback to WORLD

        pg_wrapper.PGWrapper.__init__ = init
        try:
            yield
        finally:
            pg_wrapper.PGWrapper.__init__ = original


def async_private_copy(logical_path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
    """_custom_tensor_prepare_func for async_take: a private copy of CPU tensors when staged (not when traced)."""
    if tracing or tensor.is_cuda:
        return tensor  # CUDA tensors are copied to host by torchsnapshot itself
    return tensor.detach().clone()
