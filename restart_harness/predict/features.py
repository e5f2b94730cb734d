"""What the prediction model knows about a run before it starts: the planner's files and reads per rank, the
layout, the node's CPUs and the storage's bandwidth. Nothing here launches, imports torch or touches a file."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from restart_harness.plan import checkpoint
from restart_harness.predict import restart_io
from restart_harness.resolve import Plugins
from restart_harness.targets.base import POSIX


@dataclass(frozen=True)
class Features:
    world_size: int  # ranks launched (an emulated subset: the ranks that run)
    nodes: int
    ranks_per_node: int
    cpus_per_node: int
    contention: float  # max(1, ranks_per_node / cpus_per_node): how many ranks share a core
    # the ranks of a node that save (and load) at once: all of them, or an emulated node's wave (emulate_memory_gib)
    io_ranks_per_node: int
    parameters_per_rank: float  # the model's parameters / (tp x pp)
    tokens_per_rank_step: int  # micro_batch x grad_accum x seq_len
    save_bytes: int  # one checkpoint, all launched ranks
    save_bytes_max_rank: int
    save_files_max_rank: int
    save_files: int  # files (objects) one checkpoint creates, all launched ranks
    save_bytes_at_once: int  # the most that the ranks saving at once write (save_bytes unless emulated in waves)
    # the host CPU's work of the last rank to finish its save, in bytes at one core's pace (_last_to_finish)
    save_core_bytes: float
    read_bytes: int  # a restart's reads from storage, all ranks (planner: plan/checkpoint.py stored_read_bytes)
    read_bytes_at_once: int  # the most that the ranks loading at once read
    read_core_bytes: float  # as save_core_bytes, for the restart's reads
    read_bytes_max_rank: int
    read_files_max_rank: int
    read_files: int  # file opens (object GETs) of a restart, summed over ranks
    cold_reads: bool  # the restart reads from the storage: cache=drop, or object storage (no page cache)
    write_bytes_per_s: float | None  # the storage's aggregate bandwidth, both None when unknown
    read_bytes_per_s: float | None
    metadata_ops_per_s: float | None = None  # the storage's aggregate file creates / opens (requests) per second
    # the file system holding the Python environment: its aggregate metadata operations per second (None: no limit)
    env_metadata_ops_per_s: float | None = None
    # each start-up phase's metadata operations per rank (configs/restart_io.json; None: not measured for the stack)
    startup_metadata_ops_per_rank: dict | None = None

    @property
    def io_contention(self) -> float:
        """How many of the ranks saving or loading at once share a core."""
        return max(1.0, self.io_ranks_per_node / max(1, self.cpus_per_node))

    @property
    def io_world_size(self) -> int:
        """The ranks that save or load at once, all nodes."""
        return self.io_ranks_per_node * self.nodes

    def to_json(self) -> dict:
        return asdict(self)


def at_once(plugins: Plugins, per_node: int) -> int:
    """The ranks of a node that save and load at once: an emulated node works in waves of its ranks, so that at
    most emulate_memory_gib of file state is held (plan/checkpoint.py waves); a wave's waiting for the others
    is not part of a rank's save or load."""
    if not plugins.spec.emulate or not plugins.spec.emulate_memory_gib:
        return per_node
    from restart_harness.stacks.emulated import streamable

    return min(per_node, checkpoint.waves(plugins.spec, streamable(type(plugins.engine)))[0])


def _busiest(by_rank: dict[int, int], per_node: int, io_per_node: int, cores: int) -> tuple[int, float]:
    """(the bytes of the wave that moves the most, all nodes' ranks of a wave together as they share the storage;
    the CPU work of the last rank to finish, each node's ranks of a wave together as they share its cores)."""
    shared: dict[int, int] = {}
    by_node: dict[tuple[int, int], list[int]] = {}
    for rank, n in by_rank.items():
        wave = checkpoint.wave_of(rank, per_node, io_per_node)
        shared[wave] = shared.get(wave, 0) + n
        by_node.setdefault((rank // per_node, wave), []).append(n)
    return max(shared.values(), default=0), max((_last_to_finish(w, cores) for w in by_node.values()), default=0.0)


def _last_to_finish(nbytes: list[int], cores: int) -> float:
    """When the last of these ranks finishes its bytes, in bytes at one core's pace: the ranks share the node's
    cores evenly, each using at most one, and a rank that finishes leaves its share to those still working
    (processor sharing). Equal ranks give bytes x max(1, ranks / cores); a rank that writes more than the others
    works on alone at one core's pace once they are done."""
    elapsed = done = 0.0
    for finished, n in enumerate(sorted(nbytes)):
        elapsed += (n - done) / min(1.0, cores / (len(nbytes) - finished))
        done = n
    return elapsed


def of(plugins: Plugins, cpus_per_node: int, write_bytes_per_s: float | None,
       read_bytes_per_s: float | None, metadata_ops_per_s: float | None = None,
       env_metadata_ops_per_s: float | None = None) -> Features:
    spec, layout = plugins.spec, plugins.engine.files()
    launched = spec.launched_ranks
    per_node = min(spec.ranks_per_node or launched, launched)
    save_bytes = dict.fromkeys(range(launched), 0)
    save_files = dict.fromkeys(range(launched), 0)
    size_of = {}
    if plugins.engine.saves:
        for f in checkpoint.stored_files(spec, layout):
            size_of[f.path] = f.bytes
            if f.rank < launched:
                save_bytes[f.rank] += f.bytes
                save_files[f.rank] += 1
        reads = {r: paths for r, paths in checkpoint.stored_reads(spec, layout).items() if r < launched}
    else:
        reads = {}
    read_bytes = checkpoint.stored_read_bytes(spec, layout, reads, size_of)
    io_per_node = at_once(plugins, per_node)
    save_at_once, save_core = _busiest(save_bytes, per_node, io_per_node, cpus_per_node)
    read_at_once, read_core = _busiest(read_bytes, per_node, io_per_node, cpus_per_node)
    startup, _ = restart_io.lookup(spec.stack, spec.engine, plugins.stack.default_engine)  # None: not measured
    return Features(
        world_size=launched, nodes=max(1, -(-launched // per_node)), ranks_per_node=per_node,
        cpus_per_node=cpus_per_node, contention=max(1.0, per_node / max(1, cpus_per_node)),
        io_ranks_per_node=io_per_node,
        parameters_per_rank=spec.shape.num_parameters() / (spec.tp * spec.pp),
        tokens_per_rank_step=spec.micro_batch * spec.grad_accum * (spec.seq_len or 0),
        save_bytes=sum(save_bytes.values()), save_bytes_max_rank=max(save_bytes.values(), default=0),
        save_files_max_rank=max(save_files.values(), default=0), save_files=sum(save_files.values()),
        save_bytes_at_once=save_at_once, save_core_bytes=save_core,
        read_bytes=sum(read_bytes.values()), read_bytes_max_rank=max(read_bytes.values(), default=0),
        read_bytes_at_once=read_at_once, read_core_bytes=read_core,
        read_files_max_rank=max((len(p) for p in reads.values()), default=0),
        read_files=sum(len(p) for p in reads.values()),
        cold_reads=spec.cache == "drop" or plugins.target.kind != POSIX,
        write_bytes_per_s=write_bytes_per_s, read_bytes_per_s=read_bytes_per_s,
        metadata_ops_per_s=metadata_ops_per_s, env_metadata_ops_per_s=env_metadata_ops_per_s,
        startup_metadata_ops_per_rank={p: v["metadata_ops"] for p, v in startup.items()} if startup else None)
