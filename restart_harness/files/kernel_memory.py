"""What the kernel says of memory: this process's memory cgroup (limit, usage, OOM kills) and the OOM killer's kills in
the kernel log (/dev/kmsg, where readable), read around each launch so a rank killed for memory is named as the cause
of a failure, not its peers' lost connections (phases/processes.py); and whether it hands free memory back to a
hypervisor (free_page_reporting_order)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# where the kernel says it (a test points them at a stand-in)
CGROUP_ROOT, PROC_CGROUP, KMSG = Path("/sys/fs/cgroup"), Path("/proc/self/cgroup"), "/dev/kmsg"
BALLOONS = Path("/sys/bus/virtio/drivers/virtio_balloon")  # the virtio balloon devices, each with its features
REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
VIRTIO_BALLOON_F_REPORTING = 5  # the feature bit of free page reporting (virtio 1.2, 5.1.3)
MAX_PAGE_ORDER = 10  # the largest free block Linux keeps, 2**10 pages (x86-64; arm64 with 4 KiB pages)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup() -> tuple[Path, int] | None:
    """(folder, version) of this process's memory cgroup: v2's (a memory.events beside it) or v1's memory controller."""
    for line in (_read(PROC_CGROUP) or "").splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if hierarchy == "0":
            for base in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                if (base / rel / "memory.events").is_file():
                    return base / rel, 2
        elif "memory" in controllers.split(",") and (CGROUP_ROOT / "memory" / rel / "memory.oom_control").is_file():
            return CGROUP_ROOT / "memory" / rel, 1
    return None


def _number(path: Path) -> int | None:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def cgroup_memory() -> dict | None:
    """This process's memory cgroup: {path, version, limit_bytes (None: no limit below the machine's memory),
    usage_bytes, peak_bytes, oom_kills}, or None where it has none that can be read."""
    found = _cgroup()
    if found is None:
        return None
    folder, version = found
    names = (("memory.max", "memory.current", "memory.peak", "memory.events") if version == 2 else
             ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control"))
    limit, usage, peak = (_number(folder / n) for n in names[:3])
    fields = (line.partition(" ") for line in (_read(folder / names[3]) or "").splitlines())
    kills = next((int(value) for key, _, value in fields if key == "oom_kill" and value.strip().isdigit()), None)
    total = meminfo("MemTotal:")
    if limit is not None and total is not None and limit >= total:
        limit = None  # v1 writes "no limit" as a huge number
    return {"path": str(folder), "version": version, "limit_bytes": limit, "usage_bytes": usage, "peak_bytes": peak,
            "oom_kills": kills}


def meminfo(field: str) -> int | None:
    """A /proc/meminfo figure in bytes ("MemAvailable:")."""
    lines = (_read(Path("/proc/meminfo")) or "").splitlines()
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(field)), None)


def available_bytes() -> int | None:
    """The memory a new process can have now: MemAvailable, or less where this process's cgroup limit leaves less."""
    free = meminfo("MemAvailable:")
    group = cgroup_memory()
    if group and group["limit_bytes"] is not None and group["usage_bytes"] is not None:
        room = max(0, group["limit_bytes"] - group["usage_bytes"])
        free = room if free is None else min(free, room)
    return free


def free_page_reporting_order() -> int | None:
    """The order of the free blocks (2**order pages and larger) this kernel hands back to its hypervisor, which drops
    their memory: a virtio balloon with free page reporting (Firecracker, QEMU with free-page-reporting=on), about 2 s
    after a block is freed. Touching such memory again costs the host's fault too: on this project's virtual machine
    about 400 MiB/s, against about 3,400 for memory freed within the guest and 8,000-11,000 in huge pages
    (docs/benchmarks.md, twentieth session). A transparent huge page is such a block. None where nothing is reported
    (no such balloon, or an order above MAX_PAGE_ORDER set to turn it off)."""
    order = _number(REPORTING_ORDER)
    if order is None or order > MAX_PAGE_ORDER:
        return None
    for features in sorted(BALLOONS.glob("virtio*/features")):  # one '0' or '1' per feature bit, bit 0 first
        bits = (_read(features) or "").strip()
        if len(bits) > VIRTIO_BALLOON_F_REPORTING and bits[VIRTIO_BALLOON_F_REPORTING] == "1":
            return order
    return None


def reporting_said(order: int | None) -> str | None:
    """What free page reporting at `order` (free_page_reporting_order's, or a run's recorded one) means for the
    figures: the terminal's `fresh memory` line and compare_engines' header; None where nothing is reported."""
    if order is None:
        return None
    return (f"free page reporting on (order {order}): free blocks of {4 << order:,} KiB go back to the hypervisor, so "
            "memory first touched (a load's buffers, a first save's staging, the page cache) costs a host fault, which "
            "the ceiling's probes do not (docs/measurements.md#storage-ceiling)")


# ---- the kernel log ----------------------------------------------------------------------------------------------
KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\) total-vm:(\d+)kB, anon-rss:(\d+)kB, file-rss:(\d+)kB, "
                    r"shmem-rss:(\d+)kB")
MEMCG_USAGE = re.compile(r"^memory: usage (\d+)kB, limit (\d+)kB")
CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+)")
MEMCG = re.compile(r",oom_memcg=([^,]+)")


class KernelLog:
    """The kernel log from now on: /dev/kmsg opened at its end (None where it cannot be read: no CAP_SYSLOG, or
    dmesg_restrict); kills() parses what was logged since into the OOM killer's kills."""

    def __init__(self):
        try:
            self.fd: int | None = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.fd = None

    def lines(self) -> list[str]:
        out: list[str] = []
        while self.fd is not None:
            try:
                record = os.read(self.fd, 8192)
            except BrokenPipeError:  # records overwritten before they were read: go on with the next
                continue
            except OSError:  # BlockingIOError: nothing more to read
                break
            if not record:
                break
            out.append(record.decode(errors="replace").partition(";")[2].rstrip("\n"))
        return out

    def kills(self) -> list[dict] | None:
        """[{pid, process, anon_rss_bytes, total_vm_bytes, constraint, cgroup, cgroup_usage_bytes,
        cgroup_limit_bytes}] logged since the log was opened, or None where it is not readable."""
        if self.fd is None:
            return None
        out, usage, constraint = [], None, None
        for line in self.lines():
            if m := MEMCG_USAGE.match(line):
                usage = (int(m[1]) * 1024, int(m[2]) * 1024)
            elif m := CONSTRAINT.search(line):
                memcg = MEMCG.search(line)
                constraint = (m[1], memcg[1] if memcg else None)
            elif m := KILLED.search(line):
                out.append({"pid": int(m[1]), "process": m[2], "total_vm_bytes": int(m[3]) * 1024,
                            "anon_rss_bytes": int(m[4]) * 1024, "rss_bytes": sum(int(m[i]) for i in (4, 5, 6)) * 1024,
                            "constraint": constraint[0] if constraint else None,
                            "cgroup": constraint[1] if constraint else None,
                            "cgroup_usage_bytes": usage[0] if usage and constraint and constraint[1] else None,
                            "cgroup_limit_bytes": usage[1] if usage and constraint and constraint[1] else None})
                usage = constraint = None
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class OomWatch:
    """Around one launch: this cgroup's OOM-kill count and the kernel log from its start;
    result() is None when nothing was killed for memory, else what the kernel recorded."""

    def __init__(self):
        group = cgroup_memory()
        self.cgroup_kills = group["oom_kills"] if group else None
        self.log = KernelLog()

    def result(self) -> dict | None:
        try:
            kills = self.log.kills()
        finally:
            self.log.close()
        group = cgroup_memory()
        after = group["oom_kills"] if group else None
        rose = after is not None and self.cgroup_kills is not None and after > self.cgroup_kills
        if not kills and not rose:
            return None
        return {"kills": kills, "cgroup": group and {**group, "oom_kills_before": self.cgroup_kills},
                "machine_memory_bytes": meminfo("MemTotal:")}
