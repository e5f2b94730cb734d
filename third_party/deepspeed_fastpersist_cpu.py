"""DeepSpeed 0.19.8's FastPersist writer (`checkpoint.writer` type `fast`: FastCheckpointEngine, DeepNVMe's libaio
writer with O_DIRECT from page-locked double buffers) on DeepSpeed's CPU accelerator. Four things stand in the way,
each in DeepSpeed 0.19.8; prepare() deals with the first three in a rank before deepspeed.initialize, replica()
with the fourth when a file is loaded:

1. CheckpointWriterFactory._setup_for_aio pins its I/O buffer with get_accelerator().pin_memory(), a no-op on the
   CPU accelerator unless DS_PIN_MEMORY_BACKEND=native, and then calls Tensor.pin_memory(), which fails without an
   accelerator. DeepSpeed's own native backend (its pin_memory op: mlock'ed host memory) gives the locked buffer.
   It counts against the locked-memory limit (`ulimit -l`) of a process without CAP_IPC_LOCK (root has it): below
   the buffer (io_buffer_mib, 64 MiB by default) DeepSpeed's pin_memory op fails an assertion and aborts the rank
   (deepspeed_pin_tensor.cpp, measured as a non-root user with `ulimit -l 1024`); locked_memory_shortfall() says so
   before that happens.
2. deepspeed/io/fast_file_writer.py asks the accelerator for UtilsBuilder, which the CPU accelerator maps to
   NotImplementedBuilder; the generic deepspeed.ops.op_builder.utils.UtilsBuilder builds the same C++ source
   (flatten/unflatten and cast_to_byte_tensor) on a CPU.
3. With ZeRO stage < 3 (optimize_dp_state) CheckpointWriterFactory.create_writer names every file `X.pt-R.N`
   (writer R of N data-parallel writers), and nothing in DeepSpeed reads that name back: load_checkpoint's
   _get_all_ckpt_names and PipelineModule.ckpt_layer_path_list glob for `X.pt` and find no file. With stock torch
   serialization each `-R.N` file is a whole torch.save stream of X.pt (DeepSpeed's partitioned write needs its
   patched torch.save, which calls save_torch_storage_object_list), and with data_parallel=replica every
   data-parallel rank writes its own identical replica of the files DeepSpeed has one replica write. prepare()
   makes both globs find, for each X.pt, its first replica (lowest R; SDLoader asserts the path it is given
   exists); replica() does the same for the names DeepSpeed builds without a glob (ZeRO optimizer files).
(FastCheckpointEngine.load's torch.load without weights_only=False: third_party/deepspeed_writer_load.py.)

Remove each when tests/test_engines.py::test_fastpersist_cpu_shims_still_needed fails on it.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

ADDRESSES = "deepspeed==0.19.8"
REPLICA = re.compile(r"(.+\.pt)-(\d+)\.(\d+)")


def prepare(device: str) -> None:
    """In a rank, before deepspeed.initialize builds the FastCheckpointEngine."""
    from deepspeed.io import fast_file_writer
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.pipe.module import PipelineModule

    if device == "cpu":
        os.environ.setdefault("DS_PIN_MEMORY_BACKEND", "native")  # 1.
        from deepspeed.ops.op_builder.utils import UtilsBuilder

        fast_file_writer.UtilsBuilder = UtilsBuilder  # 2.
    DeepSpeedEngine._get_all_ckpt_names = _all_ckpt_names  # 3.
    PipelineModule.ckpt_layer_path_list = _layer_path_list


CAP_IPC_LOCK = 14  # linux/capability.h


def locked_memory_shortfall(buffer_bytes: int) -> str | None:
    """Why this process could not lock buffer_bytes with DeepSpeed's native pinned memory, or None when it can."""
    import resource

    try:
        status = Path("/proc/self/status").read_text()
        effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        effective = 0
    if effective >> CAP_IPC_LOCK & 1:
        return None  # CAP_IPC_LOCK (root): no limit applies
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= buffer_bytes:
        return None
    return (f"its writer locks {buffer_bytes // 2**20} MiB per rank (io_buffer_mib) and this user may lock "
            f"{soft // 1024} KiB (ulimit -l), so DeepSpeed's pin_memory op would abort the rank (an assertion in "
            "deepspeed_pin_tensor.cpp); raise the limit (ulimit -l, memlock in /etc/security/limits.conf) or lower "
            "io_buffer_mib")


def names(pattern: str) -> list[str]:
    """The files a DeepSpeed glob pattern finds, each `X.pt` written as replicas `X.pt-R.N` given by its first."""
    found = {p: p for p in glob.glob(pattern)}
    for p in sorted(glob.glob(pattern + "-*.*"), key=_replica_order):
        if (m := REPLICA.fullmatch(p)):
            found.setdefault(m.group(1), p)
    return [found[name] for name in sorted(found)]


def replica_name(path: str, writer_rank: int, writers: int) -> str:
    """The name CheckpointWriterFactory.create_writer gives `path` for writer `writer_rank` of `writers`."""
    return f"{path}-{writer_rank}.{writers}"


def replica(path: str) -> str:
    """The file to read for DeepSpeed's `path`: itself if it exists, else its first replica `path-R.N`."""
    if os.path.exists(path) or REPLICA.fullmatch(path):
        return path
    found = sorted((p for p in glob.glob(glob.escape(path) + "-*.*") if REPLICA.fullmatch(p)), key=_replica_order)
    if not found:
        raise FileNotFoundError(f"neither {path} nor a FastPersist replica {path}-R.N of it exists")
    return found[0]


def _replica_order(path: str) -> tuple:
    m = REPLICA.fullmatch(path)
    return (m.group(1), int(m.group(2))) if m else (path, -1)


def _all_ckpt_names(self, checkpoints_path, tag):
    """DeepSpeedEngine._get_all_ckpt_names (0.19.8), its glob through names()."""
    universal = self.load_universal_checkpoint()
    return names(self._get_ckpt_name(checkpoints_path, tag, mp_placeholder="*",
                                     pp_placeholder="0" if universal else None))


def _layer_path_list(self, ckpt_dir, local_layer_idx):
    """PipelineModule.ckpt_layer_path_list (0.19.8), its glob through names()."""
    return names(os.path.join(ckpt_dir, f"layer_{local_layer_idx + self._local_start:02d}-*model_states.pt"))
