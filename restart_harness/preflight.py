"""Checks of the machine and the file systems, after the command line is validated and before anything is created:
the device, whether the engine runs here, the launcher's tools, that the result and checkpoint folders can be
created (proven with a probe, not guessed), that the checkpoint fits, and for a restart-only re-run that the run is
finished and its committed checkpoint whole. Each problem is one UsageError line (exit code 2)."""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.launch import launchers
from restart_harness.results import events as ev
from restart_harness.spec.command import BaselineOptions, RestartRequest
from restart_harness.spec.runspec import RunSpec
from restart_harness.storage.filesystem import free_bytes, nearest_existing, why_not_a_directory
from restart_harness.storage.s3 import S3Settings, S3Url, check_writable, is_s3

MIB = 1 << 20


def resolve_device(spec: RunSpec) -> None:
    if spec.device == "auto":
        spec.device = "cuda" if glob.glob("/dev/nvidia[0-9]*") else "cpu"


def engine(spec: RunSpec):
    from engines import registry

    eng = registry.get(spec.engine)(spec)
    eng.check()
    return eng


def directory(key: str, path: str) -> None:
    reason = why_not_a_directory(Path(path))
    if reason:
        raise UsageError(f"{key}={path}: {reason}")


def checkpoint_space(spec: RunSpec) -> None:
    """Every checkpoint of the run must fit where it goes (the run keeps every tag it saves)."""
    from engines import registry
    from restart_harness.plan import checkpoint

    if not registry.get(spec.engine).saves or spec.phase == "restart":
        return
    saves = 1 if spec.emulate else spec.iters // spec.save_interval
    need = saves * sum(f.bytes for f in checkpoint.files(spec))
    where = nearest_existing(Path(spec.ckpt_dir or spec.results_dir))
    free = free_bytes(where)
    if need > free:
        raise UsageError(f"the checkpoints need {need / MIB:,.1f} MiB ({saves} saves of {need // saves / MIB:,.1f} "
                         f"MiB, planned) but the file system holding {where} has {free / MIB:,.1f} MiB free; "
                         "give ckpt_dir= on a larger one, or fewer saves (iters, save_interval)")


def tracer(spec: RunSpec) -> None:
    from third_party.dftracer_compat import preload_library

    if spec.trace and preload_library() is None:
        raise UsageError("trace=true needs dftracer (the PyPI package), which this Python lacks: "
                         "pip install 'restart-harness[trace]' (or dftracer==2.2.0), or trace=false")


def available_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


EMULATE_MEMORY_FRACTION = 0.6


def default_emulate_memory_gib() -> float:
    """60% of the memory this node has available now."""
    return round(EMULATE_MEMORY_FRACTION * (available_memory_bytes() or 8 << 30) / 2**30, 3)


def emulation(spec: RunSpec) -> None:
    """emulate=true: the engine can be emulated; the memory budget is set (this node's) and the largest file's
    state fits in it (a rank holds one file at a time)."""
    from engines import registry
    from restart_harness.plan import checkpoint

    if not spec.emulate:
        return
    if not registry.get(spec.engine).emulates:
        raise UsageError(f"emulate=true cannot emulate engine={spec.engine}: DeepSpeed builds that engine from its "
                         "own config inside deepspeed.initialize; accepted with emulate=true: "
                         + ", ".join(n for n, c in registry.all_engines().items() if c.emulates))
    if spec.emulate_memory_gib is None:
        if launchers.submits(spec) or spec.dry_run:
            return  # the compute node's memory decides, inside the job (launch/runner.py)
        spec.emulate_memory_gib = default_emulate_memory_gib()
    need = checkpoint.emulated_file_state_bytes(spec)
    if need > spec.emulate_memory_gib * 2**30:
        raise UsageError(f"emulate=true: the largest file needs {need / 2**30:,.1f} GiB of memory to build and save "
                         f"(its tensors, and what the engine stages beside them) but emulate_memory_gib="
                         f"{spec.emulate_memory_gib:g}; give more memory, or a layout with more ranks (tp, pp, dp) "
                         "so that files are smaller")


def run(spec: RunSpec) -> None:
    """A run (or one combination of a sweep): everything that can be checked before the run directory exists."""
    resolve_device(spec)
    engine(spec)
    tracer(spec)
    emulation(spec)
    launchers.check(spec)
    directory("results_dir", spec.results_dir)
    if is_s3(spec.ckpt_dir):
        if not spec.dry_run:
            object_store("ckpt_dir", spec.ckpt_dir)
    elif spec.ckpt_dir:
        directory("ckpt_dir", spec.ckpt_dir)
    if not spec.dry_run:
        if not is_s3(spec.ckpt_dir):
            checkpoint_space(spec)
        extension_locks()


def object_store(key: str, url: str) -> None:
    """An s3:// target: the client is installed, the endpoint answers, the bucket exists, the credentials list and
    write there (a probe object, deleted again)."""
    try:
        import s3torchconnector  # noqa: F401
    except ImportError:
        raise UsageError(f"{key}={url}: object storage needs s3torchconnector, which this Python lacks: "
                         "pip install 'restart-harness[s3]'") from None
    problem = check_writable(S3Url.parse(url), S3Settings.from_environment())
    if problem:
        raise UsageError(f"{key}={url}: {problem}")


def extension_locks() -> None:
    """A JIT build lock left by a killed build would hang every rank in init_distributed (third_party)."""
    from restart_harness.storage.cache_dir import cache_dir
    from third_party.torch_extension_lock import remove_stale

    for lock in remove_stale(cache_dir("torch_extensions")):
        print(f"[setup] removed {lock}: a JIT build lock no process holds (left by an interrupted build)",
              file=sys.stderr)


def restart(request: RestartRequest) -> None:
    """A restart-only re-run: the run is not in progress, its launcher and engine run here, its checkpoint is whole."""
    from restart_harness.results.status import observed

    spec, run_dir = request.spec, request.run_dir
    status = observed(run_dir)
    if status["state"] in ("running", "submitted"):
        where = f"job {status.get('job_id')}" if status["state"] == "submitted" else f"pid {status.get('pid')}"
        raise UsageError(f"run={run_dir}: still {status['state']} ({where}); restart it once it has finished")
    launchers.check(spec)  # slurm/pbs outside an allocation: the restarts become a batch job of their own
    eng = engine(spec)
    tracer(spec)
    extension_locks()
    url = request.checkpoint_url
    if url:
        object_store("run", url)
    tag = committed_checkpoint(run_dir, request.ckpt_root, url)
    if request.reshard:
        reshardable(request, eng, tag)


def reshardable(request: RestartRequest, eng, tag: str) -> None:
    """A restart at another layout needs an engine whose files DeepSpeed's converter reads, a trained (not emulated)
    checkpoint, and the universal-checkpoint information the worker saves in every checkpoint (stack=deepspeed)."""
    spec, original = request.spec, request.original
    change = f"{original.layout} -> {spec.layout}"
    if spec.stack == "fsdp2":
        return  # DCP reshards a stack=fsdp2 checkpoint while it loads; only dp can differ (RunSpec refuses tp, pp)
    if request.checkpoint_url:
        raise UsageError(f"restart at another layout ({change}): DeepSpeed's universal-checkpoint converter reads a "
                         f"file system, and this checkpoint is in {request.checkpoint_url}; accepted: a restart at "
                         "its own layout (stack=fsdp2 runs reshard from object storage)")
    if eng.reshard != "universal":
        raise UsageError(f"restart at another layout ({change}): engine={spec.engine} writes its own format, which "
                         "DeepSpeed's universal-checkpoint converter cannot read; accepted: engine=default runs")
    if spec.emulate:
        raise UsageError(f"restart at another layout ({change}): an emulated checkpoint holds random data, not a "
                         "trained state; accepted: runs trained with emulate=false")
    saves = [s for evs in ev.of_kind(ev.read_record(request.run_dir, "checkpoint"), "save").values() for s in evs
             if s["tag"] == tag]
    if not all(s.get("universal_info") for s in saves):
        raise UsageError(f"restart at another layout ({change}): {tag} was written without the universal-checkpoint "
                         "information DeepSpeed's converter needs (a run of an older harness); restart it at its own "
                         "layout")


def baseline(options: BaselineOptions) -> None:
    from restart_harness.storage.baseline import fio_available

    if is_s3(options.dir):
        object_store("dir", options.dir)
        return
    d = Path(options.dir)
    if not d.is_dir():
        raise UsageError(f"dir={options.dir}: no such directory")
    if not os.access(d, os.W_OK) or why_not_a_directory(d):
        raise UsageError(f"dir={options.dir}: not writable")
    if options.tool == "fio" and not fio_available():
        raise UsageError("tool=fio: fio is not installed (apt-get install fio); use tool=builtin")
    ranks = options.ranks or min(os.cpu_count() or 1, 8)
    need, free = options.file_bytes * ranks, shutil.disk_usage(d).free
    if need > free // 2:
        raise UsageError(f"file_bytes x ranks = {need} bytes is more than half the {free} bytes free in {d}")


# ---- restart-only: is the committed checkpoint whole? ---------------------------------------------------------
def _size(path: Path) -> int | None:
    """Bytes of a file, or of every file below a directory (sharded engines); None when absent."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return None


def recorded_files(run_dir: Path, tag: str) -> dict[str, int]:
    """path (relative to the tag directory) -> bytes, from every rank's save event for tag."""
    out: dict[str, int] = {}
    for saves in ev.of_kind(ev.read_record(run_dir, "checkpoint"), "save").values():
        for save in saves:
            if save["tag"] == tag:
                out.update({f["path"]: f["bytes"] for f in save["files"]})
    return out


def _object_sizes(url: str, tag: str) -> dict[str, int]:
    """path -> bytes of every object of tag, and of every 'directory' of them (a DCP checkpoint per DeepSpeed file)."""
    from restart_harness.storage.s3 import listing

    out: dict[str, int] = {}
    for key, nbytes in listing(S3Url.parse(url).child(tag), S3Settings.from_environment()):
        parts = key.split("/")
        for i in range(1, len(parts) + 1):
            out["/".join(parts[:i])] = out.get("/".join(parts[:i]), 0) + nbytes
    return out


def committed_checkpoint(run_dir: Path, ckpt_root: Path, url: str | None = None) -> str:
    """The tag `latest` names, after checking every file the save recorded for it (path and bytes; for an object
    store, the bucket listing's); raises UsageError naming the first missing, truncated or torn file."""
    if not ckpt_root.is_dir():
        raise UsageError(f"run {run_dir.name}: checkpoint directory {ckpt_root} is missing; nothing to restart from")
    latest = ckpt_root / "latest"
    if not latest.is_file():
        raise UsageError(f"{latest}: missing, no checkpoint was committed; nothing to restart from")
    tag = latest.read_text().strip()
    tag_dir = ckpt_root / tag
    if not tag or not tag_dir.is_dir():
        raise UsageError(f"{tag_dir}: missing, but {latest} names it")
    recorded = recorded_files(run_dir, tag)
    if not recorded:
        raise UsageError(f"{tag_dir}: no save of {tag} is recorded in {run_dir / 'events' / 'checkpoint'}, "
                         "so it cannot be checked as complete")
    objects = _object_sizes(url, tag) if url else None
    for rel, nbytes in sorted(recorded.items()):
        actual = objects.get(rel) if objects is not None else _size(tag_dir / rel)
        if actual is None:
            raise UsageError(f"{tag_dir / rel}: missing (the save of {tag} recorded {nbytes} bytes)")
        if actual != nbytes:
            raise UsageError(f"{tag_dir / rel}: {actual} bytes, but the save of {tag} recorded {nbytes} "
                             "(truncated or torn)")
    return tag
