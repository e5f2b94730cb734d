"""This machine, and where this process runs on it: facts recorded in spec.json (software versions, host, the
checkpoint's file system; no torch import: package metadata), and the one step that completes a RunSpec against it
(resolve): what `auto` means here, before anything is checked or created."""

from __future__ import annotations

import dataclasses
import glob
import os
import platform
import socket
import time
from importlib import metadata
from pathlib import Path

import restart_harness
from restart_harness.errors import refused
from restart_harness.files import kernel_memory
from restart_harness.files.fsfacts import filesystem, why_unresolvable
from restart_harness.resolve import launcher_class
from restart_harness.spec.keys import Path as KeyPath
from restart_harness.spec.keys import keys_of

EMULATE_MEMORY_FRACTION = 0.6


def nvidia_devices() -> int:
    return len(glob.glob("/dev/nvidia[0-9]*"))


BUSY_FRACTION = 0.25  # other work using more than this share of the CPUs: predictions and timings are suspect
LOAD_WINDOW_SECONDS = 0.2  # paid before every launch: 40 jiffies on 2 CPUs, 2.5% resolution


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def load_now() -> dict:
    """How busy this machine is right now, sampled over LOAD_WINDOW_SECONDS while this process sleeps (so it counts
    other work, not the harness): the share of all CPUs in use, the 1-minute load average for context, and busy when
    the share exceeds BUSY_FRACTION. Recorded before each launch: a busy machine makes timings and predictions
    suspect (docs/measurements.md)."""
    first = _cpu_ticks()
    time.sleep(LOAD_WINDOW_SECONDS)
    second = _cpu_ticks()
    share = round((second[0] - first[0]) / (second[1] - first[1]), 3) if first and second and second[1] > first[1] \
        else None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_busy_fraction": share, "loadavg_1min": round(os.getloadavg()[0], 2), "cpus": cpus,
            "window_seconds": LOAD_WINDOW_SECONDS, "busy": share is not None and share > BUSY_FRACTION}


def load_mark() -> dict | None:
    """The start of a span of this process's work (a launch), for load_since(): the CPUs' ticks so far and the CPU
    seconds this process and its reaped children used so far."""
    ticks = _cpu_ticks()
    return None if ticks is None else {"ticks": ticks, "own_seconds": _own_cpu_seconds(), "time": time.time()}


def load_since(mark: dict | None) -> dict | None:
    """The machine's load over the span since `mark` (a launch, its ranks reaped): the share of all CPUs other work
    used (every CPU's busy ticks less this process's and its children's CPU time), the share the span's own
    processes used, ranks per core follow from the spec; the 1-minute load average at its end, for context."""
    ticks = _cpu_ticks()
    if mark is None or ticks is None or ticks[1] <= mark["ticks"][1]:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    total = ticks[1] - mark["ticks"][1]
    own = (_own_cpu_seconds() - mark["own_seconds"]) * hz
    other = max(0.0, (ticks[0] - mark["ticks"][0] - own) / total)
    return {"other_cpu_fraction": round(other, 3), "own_cpu_fraction": round(min(1.0, own / total), 3),
            "seconds": round(time.time() - mark["time"], 3), "loadavg_1min_end": round(os.getloadavg()[0], 2),
            "busy": other > BUSY_FRACTION}


def _own_cpu_seconds() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def available_memory_bytes() -> int | None:
    """MemAvailable, or less where this process's memory cgroup leaves less below its limit."""
    return kernel_memory.available_bytes()


def paths(options):
    """A spec's (or a command's options') every declared path as this machine will use it, resolved once: `~` and
    `~user` expanded; UsageError naming the key and the value where it cannot be used (no such user, a loop of
    symbolic links). Object-store locations (s3://...) are their target's."""
    changes = {}
    for name, k in keys_of(type(options)).items():
        value = getattr(options, name)
        if k.type is not KeyPath or value is None or "://" in str(value):
            continue
        if why := why_unresolvable(value):
            raise refused(name, value, why, "a path this machine can follow")
        if str(value).startswith("~"):
            changes[name] = KeyPath(Path(value).expanduser())
    return dataclasses.replace(options, **changes) if changes else options


def resolve(spec):
    """spec completed against this machine: its paths (paths()); device=auto -> cuda when NVIDIA devices are present,
    else cpu; env_hook as an absolute path; emulate=true's memory budget from this node's available memory, unless
    the run is submitted (the compute node's decides, inside the job: complete_in_job) or only written (dry_run)."""
    spec = paths(spec)
    changes: dict = {}
    if spec.device == "auto":
        changes["device"] = "cuda" if nvidia_devices() else "cpu"
    if spec.env_hook:
        changes["env_hook"] = str(Path(spec.env_hook).expanduser().absolute())
    # a submitted run's compute node decides these, inside the job (complete_in_job)
    if not launcher_class(spec.launcher).submits():
        changes.update(_node_defaults(spec, dry_run=spec.dry_run))
    return dataclasses.replace(spec, **changes) if changes else spec


def complete_in_job(spec):
    """Inside a batch job: what resolve() left to the compute node (threads per rank, the emulation memory)."""
    changes = _node_defaults(spec, dry_run=False)
    return dataclasses.replace(spec, **changes) if changes else spec


def _node_defaults(spec, dry_run: bool) -> dict:
    """threads: this node's CPUs shared by its ranks, at least one each; emulate_memory_gib: 60% of the memory this
    node has available now."""
    changes: dict = {}
    if spec.threads is None:
        changes["threads"] = max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
                                     os.cpu_count() or 1) // max(1, spec.ranks_per_node))
    if spec.emulate and spec.emulate_memory_gib is None and not dry_run:
        free = available_memory_bytes() or 8 << 30
        changes["emulate_memory_gib"] = round(EMULATE_MEMORY_FRACTION * free / 2**30, 3)
    return changes


def _cpuinfo(field: str) -> str | None:
    """The value of the first CPU's `field` in /proc/cpuinfo, or None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1]
    except OSError:
        pass
    return None


def cpu_model() -> str | None:
    """This machine's CPU model as the kernel names it (/proc/cpuinfo `model name`), or None."""
    model = _cpuinfo("model name")
    return None if model is None else " ".join(model.split())


def gpu_model() -> str | None:
    """The model of this node's first NVIDIA GPU as its driver names it (/proc/driver/nvidia/gpus/*/information), or
    None where there is no driver."""
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            for line in Path(info).read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def device_facts(device: str) -> dict:
    """What a run's ranks compute on here: the kind (cpu or cuda), its model and how many; a prediction is only this
    device's where its calibration was measured on the same (predict/forecast.py)."""
    if device == "cuda":
        return {"kind": "cuda", "model": gpu_model(), "count": nvidia_devices()}
    return {"kind": "cpu", "model": cpu_model(), "count": os.cpu_count() or 1}


def cpu_flags() -> set[str]:
    """The instruction-set flags of this machine's first CPU (/proc/cpuinfo); empty where it cannot be read."""
    return set((_cpuinfo("flags") or "").split())


def bf16_matmul_is_slow() -> bool:
    """No AVX-512 (nor AMX): torch's CPU bf16 matrix products take slow kernels. Measured on this project's AVX2 machine
    (2026-11-25, torch 2.13.0, one thread, 1024 x 1024): bf16 0.9 GFLOP/s against fp32's 55, and a `small dp=2` step
    70 s in bf16 against 4.7 s in fp32."""
    flags = cpu_flags()
    return bool(flags) and not ({"avx512f", "amx_bf16"} & flags)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def facts(checkpoint_path: Path) -> dict:
    """spec.json's versions, host and checkpoint_filesystem (of the folder holding the run's checkpoint folder)."""
    return {
        "versions": {"python": platform.python_version(), "torch": _version("torch"),
                     "deepspeed": _version("deepspeed"), "restart_harness": restart_harness.__version__},
        "host": {"hostname": socket.gethostname(), "kernel": platform.release(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "memory_bytes": kernel_memory.meminfo("MemTotal:"),
                 "cpu_avx512": "avx512f" in cpu_flags(), "cpu_model": cpu_model(), "gpu_model": gpu_model(),
                 "gpus": nvidia_devices(), "user_is_root": os.geteuid() == 0,
                 "free_page_reporting_order": kernel_memory.free_page_reporting_order()},
        "checkpoint_filesystem": filesystem(checkpoint_path)}
