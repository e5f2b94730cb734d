"""dftracer 2.2.0 (PyPI wheel) beside the harness's own I/O counters (restart_harness/iocount), and its blind spot.

1. torch.save writes through libstdc++'s ofstream, which opens the file with fopen64 and then calls write/writev on
   its descriptor. dftracer's POSIX module attributes calls to files by descriptors it saw opened with open();
   its STDIO module sees the fopen64 but not the writes, so a trace of a torch.save shows the file opened and
   closed and no byte written. With RH_IO_FOPEN_VIA_OPEN=1 the counter library opens such a file with open() and
   wraps the descriptor with fdopen(): the same file, mode and stream, and dftracer then sees every write.
2. dftracer's GOT patching (gotcha) recurses forever when another preloaded library also defines fopen/fwrite
   (its wrapper's "next" function is the other library's, whose own look-up gotcha answers with the wrapper), so
   the STDIO module is switched off (DFTRACER_DISABLE_STDIO=1) and the counter library resolves its real
   functions from libc's own handle. Python's file objects and libstdc++ use POSIX calls, which stay traced.
3. The preloaded dftracer brings its own libuv, whose exported uv_* symbols interpose the libuv that libtorch links
   statically and exports: rank 0's c10d TCPStore server then runs on dftracer's libuv, and at exit its reads go
   through gotcha after dftracer has finalized (a segfault in gotcha_get_wrappee, seen in about 1 of 6 traced
   4-rank restarts). USE_LIBUV=0 makes torch use its other TCPStore backend while tracing.
4. dftracer finalizes in the process's exit handlers, unbinding its wrappers while other threads may still call
   them: gloo's socket loop, woken by a peer rank that exited first, called close() through a wrapper whose target
   was being torn down (a segfault in close_wrapper, exit code -11 after the run's last step: 1 in 2 traced 4-rank
   runs on CI's machine one day, 2 in 12 here). finish() finalizes dftracer on every rank while all are alive, then
   waits for all of them: when the first rank exits, no other is still unbinding (and the exit handler finds
   nothing left to do).

Remove 4 when dftracer finalizes without racing the process's other threads (a traced 4-rank run without
finish() ends with exit code 0 twenty times in a row). Remove 1 and 2 when a dftracer release traces the writes of a torch.save with its STDIO module on and the counter
library off (tests/test_anatomy.py::test_dftracer_alone_misses_torch_save_writes checks it still does not); remove 3
when dftracer's wheel no longer exports libuv symbols (`nm -D` on its bundled libuv shows no `T uv_run`).
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Callable
from pathlib import Path

ADDRESSES = "dftracer==2.2.0"


def preload_library() -> Path | None:
    """libdftracer_preload.so of the installed dftracer wheel, or None when dftracer is not installed."""
    spec = importlib.util.find_spec("dftracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib64" / "libdftracer_preload.so"
    return lib if lib.is_file() else None


def environment(log_prefix: Path, data_dir: Path) -> dict[str, str]:
    """dftracer's settings for tracing the I/O under data_dir into log_prefix-<hash>-preload.pfw.gz."""
    return {
        "DFTRACER_ENABLE": "1",
        "DFTRACER_INIT": "PRELOAD",
        "DFTRACER_DATA_DIR": str(data_dir),
        "DFTRACER_LOG_FILE": str(log_prefix),
        "DFTRACER_INC_METADATA": "1",  # sizes and offsets in each event's args
        "DFTRACER_DISABLE_STDIO": "1",  # 2. above
        "RH_IO_FOPEN_VIA_OPEN": "1",  # 1. above
        "USE_LIBUV": "0",  # 3. above
    }


def finish(barrier: Callable[[], None]) -> None:
    """4. above: finalize the preloaded dftracer now (its trace written, its wrappers unbound), then wait for every
    rank. Nothing when dftracer is not preloaded into this process."""
    finalize = getattr(ctypes.CDLL(None), "_Z13dftracer_finiv", None)  # dftracer_fini() of libdftracer_preload.so
    if finalize is None:
        return
    finalize()
    barrier()
