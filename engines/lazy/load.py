"""engine=lazy's load pipeline: every part read into one preallocated buffer by `readers` threads in parallel
requests, tensors built as views of it; the rank's own ZeRO file read ahead while DeepSpeed takes in the first file
of the tag; a replicated file read with the data-parallel group (replicated.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engines.lazy import REPLICATED, Options
from engines.lazy.buffers import aligned_empty
from engines.lazy.format import check_parts, is_lazy, read_header
from engines.lazy.format import load as load_file
from engines.lazy.policy import per_rank, read_way
from engines.lazy.reads import Reads
from engines.lazy.replicated import ReplicatedReads
from engines.lazy.stats import LoadStats


class Loader:
    """A rank's restart loads."""

    def __init__(self, options: Options, storage: dict | None, ds_engine, data_parallel: tuple):
        self.options, self.ds_engine = options, ds_engine  # ds_engine: DeepSpeed's, to name the own ZeRO file
        self.pool = ThreadPoolExecutor(options.readers, thread_name_prefix="lazy-read")
        self.stats = LoadStats(read_io=read_way(options, storage))
        self.read_direct = self.stats.read_io.way == "direct"
        self.submitted: list = []  # every file read (reads.Reads): its requests and those populated ahead
        self.last_read: dict = {}  # the buffers of the last file loaded: a second load of it reads nothing
        self.prefetch: dict = {}  # path -> (header, buffers, reads) of a file read ahead
        self.prefetch_tags: set = set()
        self.dp_rank, self.dp_size, self.dp_group = data_parallel
        self.replicated = ReplicatedReads(self, options, data_parallel, per_rank(storage, "read_mib_s"))

    def statistics(self) -> dict:
        return self.stats.as_dict(self.submitted)

    def load(self, path: str, map_location=None):
        import torch

        if is_lazy(path):
            shared = self.dp_size > 1 and self.dp_group is not None and REPLICATED.search(path)
            reader = self.replicated.read if shared else self.read
            return load_file(path, map_location=map_location, reuse=self.last_read, reader=reader)
        return torch.load(path, map_location=map_location, weights_only=False)

    def read(self, path: Path, first: list[int] | None = None):
        """The file's parts read here (the parts in `first` queued first), the rank's own ZeRO file queued behind
        them; or, where it was read ahead, what is left of that."""
        ahead = self.prefetch.pop(str(path), None)
        if ahead is not None:  # read ahead while an earlier file was loaded: wait for what is left of it
            header, buffers, reads = ahead
            for r in reads:
                r.wait()
            check_parts(path, header)
        else:
            header = read_header(path)
            check_parts(path, header)
            buffers = [aligned_empty(p["bytes"]) for p in header["parts"]]
            first = first or []
            self.submit(path, header, buffers, [*first, *(k for k in range(len(buffers)) if k not in first)],
                        ahead=True, wait=True)
        remainder = (path / header["remainder"]).read_bytes()
        self.stats.read_bytes += sum(b.numel() for b in buffers) + len(remainder)
        return header, remainder, buffers

    def submit(self, path: Path, header: dict, buffers: list, parts, ahead: bool = False, wait: bool = False) -> list:
        """The parts' reads queued (reads.Reads); ahead: the rank's own ZeRO file queued behind them (read_ahead);
        wait: until they are done."""
        reads = [Reads(path / header["parts"][k]["file"], buffers[k], self.pool, self.read_direct) for k in parts]
        self.submitted += reads
        if ahead:
            self.read_ahead(path)
        if wait:
            for r in reads:
                r.wait()
        return reads

    def _own_zero_file(self, tag_dir: Path) -> Path | None:
        """This rank's own ZeRO file of the tag, named by DeepSpeed's own function (the one its load reads)."""
        engine = self.ds_engine
        try:
            if engine is None or not engine.zero_optimization() or engine.zero_elastic_checkpoint():
                return None
            return Path(engine._get_zero_ckpt_name(str(tag_dir.parent), tag_dir.name))
        except (AttributeError, TypeError, ValueError):
            return None

    def read_ahead(self, path: Path) -> None:
        """Once per tag, once the first file's own requests are queued (and a broadcast of it done): this rank's own
        ZeRO file, queued behind them, so the storage stays busy while DeepSpeed deserializes the first file and
        copies it into the model."""
        if path.parent in self.prefetch_tags:
            return
        self.prefetch_tags.add(path.parent)
        own = self._own_zero_file(path.parent)
        if own is None or own == path or not is_lazy(own):
            return
        try:
            header = read_header(own)
            check_parts(own, header)
        except (OSError, ValueError):
            return  # its own load will say what is wrong with it
        buffers = [aligned_empty(p["bytes"]) for p in header["parts"]]
        self.prefetch[str(own)] = (header, buffers, self.submit(own, header, buffers, range(len(buffers))))
        self.stats.prefetched_bytes += sum(b.numel() for b in buffers)
