"""DeepSpeed 0.19.8's CPU shared-memory allreduce (ops/csrc/cpu/comm/shm.cpp, JIT-built deepspeed_shm_comm)
creates /dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (~66 MiB per rank) and never
unlinks it: `shared_close()` exists but nothing calls it. Every launch therefore leaks its ranks' buffers into
/dev/shm, which is RAM: a test suite of launches fills memory until ranks are OOM-killed.

Once every rank has initialized (shm_initialize opens all ranks' buffers by name before returning), each rank
unlinks its own name: the mappings stay valid for the live processes and the kernel frees the memory when the last
one exits, killed ranks included. Remove when shm.cpp calls shared_close()/shm_unlink itself (grep the installed
deepspeed/ops/csrc/cpu/comm/shm.cpp for a call to shared_close other than its definition).
"""

from __future__ import annotations

import os
from pathlib import Path

ADDRESSES = "deepspeed==0.19.8"
SHM = Path("/dev/shm")


def unlink_own_buffer(rank: int) -> None:
    """Call on every rank after deepspeed.init_distributed() and a barrier (all ranks have opened all buffers)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return
    try:
        (SHM / f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}").unlink()
    except FileNotFoundError:
        pass  # op not built or ranks not all local: DeepSpeed created no buffer
