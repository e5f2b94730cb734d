"""The interface between the harness and a storage target: where a run's checkpoints are kept, chosen once from
`ckpt_dir` (restart_harness/resolve.py). Three views by audience: Target (the kind at a location, before the run
exists, and placed for a run), Stored (a run's phases) and Store (a rank's checkpoint I/O), every checkpoint named by
a local path under `root`. Each member: docs/architecture.md (storage targets)."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

# Kinds of target: what an engine may do with a checkpoint path.
POSIX = "posix"  # a file system: open, pwrite, fsync the paths themselves
OBJECT = "object"  # objects behind the path names: only through the target's streams and DCP storage layer
LATEST = "latest"  # the file (or object) naming the committed tag
# A launch variable naming other launch variables that hold folders: each rank appends rank-NNNNN/ to them before it
# imports anything (worker/main.py), so that per-process logs of a storage client never share a file.
PER_RANK_DIRS = "RH_PER_RANK_DIRS"


class NoObserver:
    """What a target reports its network I/O to when nothing measures it."""

    def region(self, category: str):
        return contextlib.nullcontext()

    def add_bytes(self, category: str, nbytes: int) -> None:
        pass


NO_OBSERVER = NoObserver()


class Target(ABC):
    """A kind of storage at one location, for the command line and preflight; placed (root set), one run's place,
    recorded in spec.json. Its two other views: Stored (a run's phases) and Store (a rank's checkpoint I/O)."""

    name: ClassVar[str]  # recorded in spec.json as checkpoint_target
    kind: ClassVar[str]  # POSIX or OBJECT
    description: ClassVar[str]
    # checksums= (files/checksum.py): a rank reads its committed files back through their local paths for their
    # sha256; None where it can, else why not (one line's end)
    no_checksums: ClassVar[str | None] = None
    Stored: ClassVar[type[Stored]]  # the phase-side view of a placed target of this kind

    def __init__(self, location: str | None, root: Path | None = None, results_dir: str | Path | None = None):
        self.location = location  # ckpt_dir as given (None: inside the run directory)
        self.root = root  # the run's local checkpoint folder; None before the run exists
        self.results_dir = Path(results_dir) if results_dir is not None else None  # where runs go (no ckpt_dir)

    @classmethod
    @abstractmethod
    def claims(cls, location: str | None) -> bool:
        """Is `ckpt_dir=location` this target's (its scheme)? UsageError when it is, but malformed (pure: no network,
        no file system)."""

    @abstractmethod
    def preflight(self, key: str, need_bytes: int | None, reach: bool = True) -> None:
        """Raise UsageError (one line, naming `key`=location) when checkpoints cannot be written there now, or when
        need_bytes (the planned checkpoints; None: unknown) cannot fit. reach=False: only what needs no network
        (dry_run=true writes scripts, nothing else)."""

    @abstractmethod
    def placed(self, run_dir: Path) -> Target:
        """This target for the run whose directory was just made (root set)."""

    def record(self, run_dir: Path) -> dict:
        """What spec.json records of the placed target: checkpoint_target, checkpoint_root (and
        checkpoint_root_in_run when root is inside the run directory); a target adds its own fields."""
        inside = self.root.relative_to(run_dir).as_posix() if self.root.is_relative_to(run_dir) else None
        return {"checkpoint_target": self.name, "checkpoint_run": run_dir.name, "checkpoint_root": str(self.root),
                "checkpoint_root_in_run": inside, "checkpoint_data_in_run": inside is not None}

    @classmethod
    @abstractmethod
    def from_record(cls, record: dict, root: Path) -> Target:
        """The placed target of a run, from its record (spec.json) and its local root."""

    def describe(self) -> str:
        """Where the checkpoints are, for humans (a path or a URL)."""
        return str(self.root or self.location)

    @abstractmethod
    def storage_probe(self) -> StorageProbe:
        """The probe of the storage this target writes to (files/baseline.py measures, caches and renders it)."""


class Stored(ABC):
    """One run's stored checkpoints as its phases see them (a placed target's): the committed tag, every stored file,
    deletion, the page cache before a restart, the storage client's request log, unfinished uploads."""

    Store: ClassVar[type[Store]]  # the rank-side view

    def __init__(self, target: Target):
        self.target, self.root = target, target.root

    def store(self, observer=NO_OBSERVER) -> Store:
        """The rank-side view, reporting its network I/O to `observer` (a rank's anatomy: worker/anatomy.py)."""
        return self.Store(self.target, observer)

    def latest(self) -> str | None:
        """The committed tag (the local `latest`: every target keeps one under root), or None when nothing was
        committed."""
        path = self.root / LATEST
        return path.read_text().strip() if path.is_file() else None

    def missing(self) -> str | None:
        """Why the run's checkpoint storage itself is gone (deleted, moved), or None."""
        return None

    @abstractmethod
    def listing(self) -> dict[str, list[tuple[str, int]]]:
        """tag -> (path relative to the tag, bytes) of every stored file or object, for every tag of the run."""

    @abstractmethod
    def delete(self) -> str:
        """Delete the run's checkpoints (keep=false); says what was deleted."""

    @abstractmethod
    def prepare_cache(self, tag_dir: Path, requested: str, per_file: bool = False) -> dict:
        """Make the page-cache state `requested` (drop | warm) for what a restart will read under tag_dir, and
        record what was observed (files/pagecache.py's record); `per_file`: evict only those files, never the
        whole cache (env_cache=warm)."""

    def launch_environment(self, log_dir: Path) -> dict[str, str]:
        """Variables for the ranks of one launch so that the storage's client logs its requests under log_dir."""
        return {}

    def requests(self, log_dir: Path) -> dict | None:
        """The client's requests of one launch, from what launch_environment made it log (None: no such log):
        restart_harness/schema.py CLIENT_REQUEST_FIELDS."""
        return None

    def abort_incomplete_uploads(self) -> dict | None:
        """Uploads a failed save left unfinished under the run's place, aborted: {"aborted": [names], "error": why
        they could not be listed or aborted, or None}; None where the storage has no such thing."""
        return None


class Store(ABC):
    """A rank's checkpoint I/O on a placed target: what torch.save, DCP and the checkpoint manager write and read
    through. `observer`: the rank's anatomy (worker/anatomy.py); a target whose I/O the counters cannot see (network
    streams) times its blocking calls in observer.region("read" | "write") and counts their bytes."""

    def __init__(self, target: Target, observer=NO_OBSERVER):
        self.target, self.root, self.observer = target, target.root, observer

    @abstractmethod
    def destination(self, path: str | Path, mode: str) -> contextlib.AbstractContextManager:
        """A context yielding what torch.save (mode "wb") or torch.load ("rb") takes for `path`: the path itself, or a
        stream that is complete (durable) when the context exits."""

    @abstractmethod
    def dcp_writer(self, path: str | Path) -> Any:
        """A torch.distributed.checkpoint StorageWriter for a checkpoint at `path`."""

    @abstractmethod
    def dcp_reader(self, path: str | Path) -> Any:
        """A torch.distributed.checkpoint StorageReader for a checkpoint at `path`."""

    def written(self, paths: list[str]) -> None:
        """An engine has written `paths` (files, or folders of shards): make their names findable under root."""

    @abstractmethod
    def make_durable(self, paths: list[str | Path]) -> None:
        """Until `paths` (and everything under a folder among them) survive a crash: fsync, or nothing where a
        completed upload already is."""

    @abstractmethod
    def size(self, path: str | Path) -> int:
        """Bytes stored for `path` (every file or object under it, for a folder of shards)."""

    @abstractmethod
    def exists(self, path: str | Path) -> bool:
        """Is there a checkpoint file (or object) at `path`?"""

    @abstractmethod
    def commit_latest(self, tag: str) -> None:
        """Atomically make `latest` name tag. The one writer of `latest`: called by rank 0 once every rank's files
        are durable (worker/manager.py)."""

    latest = Stored.latest

    def explain_save_failure(self, exc: BaseException, tag: str) -> BaseException:
        """A save's exception, reworded where the storage knows the real cause (a full disk)."""
        return exc


class StorageProbe(ABC):
    """The storage baseline's side of a target, apart from the checkpoint I/O a run's ranks use: where a probe
    writes, its cache key and free space, and the probe itself (files/baseline.py times, caches and renders it)."""

    def __init__(self, target: Target):
        self.target = target

    def describe(self) -> str:
        return self.target.describe()

    def check(self, key: str) -> None:
        """Raise UsageError when the storage cannot be probed at the location (`./submit-job.sh baseline`)."""
        self.target.preflight(key, None)

    @abstractmethod
    def key(self) -> str:
        """One cache folder per storage (host and file system, or endpoint and bucket)."""

    def free_bytes(self) -> int | None:
        """Free space for a probe (None: the storage has no such figure)."""
        return None

    @abstractmethod
    def measure(self, file_bytes: int, ranks: int, tool: str) -> dict:
        """Measure the storage: `ranks` writers each write file_bytes and make it durable, then `ranks` readers read it
        back cold; returns files/baseline.py's record (write, read, read_cache, method, tool, dir, filesystem,
        write_means, read_means)."""

    def measure_ceiling(self, file_bytes: int, ranks: int, tool: str) -> dict | None:
        """The same files written and read the way this storage does best (files/baseline.py: the ceiling), or None
        where it has no way other than the baseline's; returns write, read, read_cache, method, request_bytes,
        queue_depth, o_direct, refused (why O_DIRECT was not used, or None), write_means, read_means."""
        return None
