"""ckpt_dir=PATH (or none: the run directory's checkpoint/): a POSIX file system, local or parallel. Files are made
durable by fsync (file data, then the directories naming them), `latest` is written atomically (temporary file,
fsync, rename, fsync the folder), a restart's page cache is evicted and observed with mincore, and the baseline
probe is fio or a built-in one (targets/_fs_probe.py)."""

from __future__ import annotations

import contextlib
import errno
import shutil
from pathlib import Path

from restart_harness.errors import RunFailed, UsageError
from restart_harness.files import pagecache
from restart_harness.files.atomic import files_under, fsync_paths, write_text_atomic
from restart_harness.files.exclusive import claim_dir
from restart_harness.files.fsfacts import free_bytes, nearest_existing, why_not_a_directory
from restart_harness.targets._fs_probe import FileSystemProbe
from restart_harness.targets.base import LATEST, POSIX, Store, Stored, Target

MIB = 1 << 20
FULL_DISK_BYTES = 1 << 20
IN_RUN = "checkpoint"  # the checkpoint folder inside a run directory (no ckpt_dir given)


class FileSystemStore(Store):
    def destination(self, path, mode):
        return contextlib.nullcontext(str(path))  # the path itself

    def dcp_writer(self, path):
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(str(path))

    def dcp_reader(self, path):
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(str(path))

    def make_durable(self, paths) -> None:
        fsync_paths([f for p in paths for f in files_under(Path(p))])

    def size(self, path) -> int:
        return sum(f.stat().st_size for f in files_under(Path(path)))

    def exists(self, path) -> bool:
        return Path(path).exists()

    def commit_latest(self, tag: str) -> None:
        write_text_atomic(self.root / LATEST, tag)

    def explain_save_failure(self, exc: BaseException, tag: str) -> BaseException:
        """torch.save reports a full disk as 'unexpected pos ...' from its zip writer: name the real cause."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            return exc
        if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or free < FULL_DISK_BYTES:
            return OSError(errno.ENOSPC, f"No space left on device while saving {tag}: {free} bytes free on the "
                                         f"checkpoint filesystem at {self.root} ({type(exc).__name__}: {exc})")
        return exc


class FileSystemStored(Stored):
    Store = FileSystemStore

    def missing(self) -> str | None:
        return None if self.root.is_dir() else f"checkpoint directory {self.root} is missing"

    def listing(self) -> dict[str, list[tuple[str, int]]]:
        tags = sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
        return {d.name: [(f.relative_to(d).as_posix(), f.stat().st_size) for f in files_under(d)] for d in tags}

    def delete(self) -> str:
        if self.root.is_dir():
            shutil.rmtree(self.root)
        return str(self.root)

    def prepare_cache(self, tag_dir: Path, requested: str, per_file: bool = False) -> dict:
        return pagecache.prepare(files_under(tag_dir), requested, per_file)


class FileSystemTarget(Target):
    name = "filesystem"
    kind = POSIX
    description = "a file system (local or parallel): files, fsync, atomic rename"
    Stored = FileSystemStored

    @classmethod
    def claims(cls, location: str | None) -> bool:
        return location is None or "://" not in str(location)

    def _base(self) -> Path:
        """Where a run's checkpoint folder would be made: ckpt_dir, or the results folder."""
        return Path(self.location or self.results_dir or ".").expanduser()

    def preflight(self, key: str, need_bytes: int | None, reach: bool = True) -> None:
        if self.location and (reason := why_not_a_directory(Path(self.location))):
            raise UsageError(f"{key}={self.location}: {reason}")
        if need_bytes:
            where = nearest_existing(self._base())
            if need_bytes > (free := free_bytes(where)):
                raise UsageError(f"the checkpoints need {need_bytes / MIB:,.1f} MiB (planned) but the file system "
                                 f"holding {where} has {free / MIB:,.1f} MiB free; give ckpt_dir= on a larger one, or "
                                 "fewer saves (iters, save_interval)")

    def placed(self, run_dir: Path) -> FileSystemTarget:
        """The run's checkpoint folder: inside its run directory, or under ckpt_dir claimed by mkdir (a fresh name
        where another run's folder of that name is there: two runs never share one, files/exclusive.py)."""
        if not self.location:
            return FileSystemTarget(None, run_dir / IN_RUN)
        try:
            root = claim_dir(Path(self.location).expanduser().resolve(), run_dir.name)
        except OSError as exc:
            raise RunFailed(f"ckpt_dir={self.location}: cannot claim a checkpoint folder there: {exc}") from None
        return FileSystemTarget(self.location, root)

    @classmethod
    def from_record(cls, record: dict, root: Path) -> FileSystemTarget:
        return cls(None, root)

    def storage_probe(self) -> FileSystemProbe:
        return FileSystemProbe(self)
