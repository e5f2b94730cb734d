"""engine=fastpersist: DeepSpeed's FastPersist writer (`checkpoint.writer` type `fast`), built by DeepSpeed from
ds_config.json, and engine=decoupled: the same writer in a decoupled process per node, committed by DeepSpeed in the
next engine.step(), CUDA only. Their files and what is refused: docs/engines.md#enginefastpersist-on-a-cpu-node."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engines import _async_io
from engines.base import CheckpointIO, Engine, EngineContext, FileLayout, NativeIO
from restart_harness.errors import UsageError
from restart_harness.plugins import NodeCheck
from restart_harness.spec.keys import key
from third_party import deepspeed_arch_list, deepspeed_decoupled_cause
from third_party import deepspeed_fastpersist_cpu as cpu_writer
from third_party.deepspeed_decoupled_grad import detached
from third_party.deepspeed_writer_load import load as writer_load


@dataclass
class Options:
    io_buffer_mib: int = key(64, "checkpoint.writer.io_buffer_size", group="checkpoint", unit="MiB", minimum=1)
    io_buffer_double: bool = key(True, "double buffering", group="checkpoint")
    io_multiplier: int = key(1, "checkpoint.writer.io_multiplier", group="checkpoint", minimum=1)
    data_parallel: str = key("replica", "which data-parallel ranks write", group="checkpoint",
                             choices=("replica", "socket", "machine"))
    show_statistics: bool = key(False, "DeepSpeed prints the writer's statistics", group="checkpoint")


class WriterFiles(FileLayout):
    """DeepSpeed's torch.save files under the FastPersist writer's names."""

    def stored(self, recipe, rank_of) -> list[tuple[str, int]]:
        """`X.pt-R.N`, writer R of N data-parallel writers (N: the data-parallel degree with data_parallel=replica,
        the nodes with machine, two per node with socket; times io_multiplier). Every data-parallel rank writes its
        own replica of a model-states file; a ZeRO shard is its own rank's; a pipeline layer file is written by
        data-parallel rank 0 alone."""
        spec, o = self.spec, self.options
        units = {"replica": spec.dp, "machine": spec.nodes, "socket": 2 * spec.nodes}[o.data_parallel]
        writers = units * o.io_multiplier
        if recipe.kind == "model_states":
            return [(cpu_writer.replica_name(recipe.path, d, writers), rank_of(d)) for d in range(spec.dp)]
        own = recipe.dp_rank if recipe.dp_rank is not None else 0
        return [(cpu_writer.replica_name(recipe.path, own, writers), recipe.writer)]


class FastPersistEngine(Engine):
    name = "fastpersist"
    description = "DeepSpeed FastPersist writer (checkpoint.writer type fast) - libaio, O_DIRECT, locked double buffers"
    Options = Options
    emulates = False  # DeepSpeed builds the engine from its config inside deepspeed.initialize
    planned_names = True  # DeepSpeed's torch.save files under the writer's names (WriterFiles)
    file_layout = WriterFiles
    durable_on_wait = True  # FastFileWriter fsyncs each file it closes (decoupled: in its writer process)
    decoupled = False

    def asynchronous(self) -> bool:
        return self.decoupled

    def host_buffer_bytes(self, rank_bytes: int) -> int:
        return (self.options.io_buffer_mib << 20) * (2 if self.options.io_buffer_double else 1)

    def node_checks(self) -> list[NodeCheck]:
        """DeepSpeed's async_io op can be loaded or built here (libaio: engines/_async_io.py), on any device; on a CPU
        node also the locked memory its writer's buffers take (a CUDA node's DeepSpeed pins through CUDA)."""
        def async_io() -> str | None:
            why = _async_io.shortfall()
            return f"{why}; or use engine=default, lazy, torchsnapshot or dcp" if why else None

        checks = [NodeCheck(f"engine={self.name}", "DeepSpeed's async_io op prebuilt, or libaio's header and "
                                                   "library to build it, and its runtime library", async_io)]
        if self.spec.device != "cuda":
            checks.append(NodeCheck(f"engine={self.name}", f"{self.options.io_buffer_mib} MiB of locked memory per "
                                                           "rank (ulimit -l)", self.locked_memory))
        return checks

    def locked_memory(self) -> str | None:
        return cpu_writer.locked_memory_shortfall(self.options.io_buffer_mib * 2**20)

    def check(self) -> None:
        spec, o = self.spec, self.options
        if o.data_parallel != "replica" and (spec.ranks_per_node > 1 or spec.tp * spec.pp > 1):
            raise UsageError(
                f"data_parallel={o.data_parallel} with {spec.ranks_per_node} ranks per node (tp={spec.tp}, "
                f"pp={spec.pp}): DeepSpeed 0.19.8's DataParallelWriterFactory.create_config gives every rank that is "
                f"not its {o.data_parallel}'s writer the writer name of rank 0 of 1, so two ranks would write one "
                "file X.pt-0.1 at once; accepted: data_parallel=replica, or one rank per node with tp=pp=1")

    def ds_config(self) -> dict:
        """DeepSpeed's checkpoint.writer block, from the options."""
        o = self.options
        return {"checkpoint": {"writer": {
            "type": "fast", "decoupled": self.decoupled, "io_buffer_size": o.io_buffer_mib * 2**20,
            "io_buffer_double": o.io_buffer_double, "io_multiplier": o.io_multiplier,
            # Without a data_parallel unit DeepSpeed 0.19.8 crashes at initialize on pure data parallel.
            "data_parallel": o.data_parallel, "show_statistics": o.show_statistics}}}

    def prepare(self) -> None:
        if self.spec.device != "cuda" and (why := self.locked_memory()):
            raise RuntimeError(f"engine={self.name}: {why}")  # instead of DeepSpeed aborting the rank
        deepspeed_arch_list.prepare()  # before DeepSpeed JIT-builds the writer's ops on CUDA
        cpu_writer.prepare(self.spec.device)

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return WriterIO(ctx.native, ctx.target)


class WriterIO(NativeIO):
    """The FastCheckpointEngine DeepSpeed built from checkpoint.writer. A save returns the file the writer really
    made (`X.pt-R.N`, DeepSpeed's CheckpointWriterFactory names it); a load reads the first replica of X.pt
    (third_party/deepspeed_fastpersist_cpu.py) with the fixed torch.load of third_party/deepspeed_writer_load.py."""

    def __init__(self, native, target):
        super().__init__(native, target)
        self._stats: Counter = Counter()  # the writers' own counters, summed since the last statistics()
        self._writers: list = []  # those of the save in progress
        factory = getattr(native, "_writer", None)  # DeepSpeed's CheckpointWriterFactory; None without a writer
        if factory is not None:
            from deepspeed.io import fast_file_writer

            # the writer loads its UtilsBuilder op when it opens its first file: a JIT build the first time on a
            # machine (about 35 s on 2 cores), which belongs to engine initialization, not to the first save
            fast_file_writer.UtilsBuilder().load()
            create = factory.create_writer

            def created(file_path, optimize_dp_state):
                self._writers.append(create(file_path, optimize_dp_state))
                return self._writers[-1]

            factory.create_writer = created

    def save(self, state, path):
        self._writers = []
        self.native.save(state, path)  # FastCheckpointEngine writes to a path of its own naming
        for writer in self._writers:  # released: its counters are final
            self._stats.update({k: v for k, v in writer._stats.items() if isinstance(v, (int, float))})
        return [writer._file_path for writer in self._writers]

    def statistics(self) -> dict | None:
        """DeepNVMe's FastFileWriter counters (its libaio writes, buffer fills, unaligned tail), summed over the files
        of the save; its speeds are left out (a sum of speeds means nothing), the seconds and bytes give them."""
        stats, self._stats = self._stats, Counter()
        return {k: round(v, 6) for k, v in sorted(stats.items()) if not k.endswith("/s") and k != "rank"} or None

    def read_path(self, path: str) -> str:
        return cpu_writer.replica(path)

    def load(self, path, map_location=None, into=None):
        return writer_load(self.read_path(path), map_location)


class DecoupledEngine(FastPersistEngine):
    name = "decoupled"
    description = "DeepSpeed FastPersist writer in a decoupled process, committed at the next step (CUDA only)"
    decoupled = True
    committed_by_deepspeed = True

    def check(self) -> None:
        if self.spec.device != "cuda":
            raise UsageError(f"engine=decoupled cannot run on device={self.spec.device}: DeepSpeed 0.19.8's "
                             "DecoupledCheckpointEngine writes from a writer process it starts with spawn, which has "
                             "none of the CPU work-arounds engine=fastpersist runs with in the rank (its pinned buffer, "
                             "its UtilsBuilder; third_party/deepspeed_fastpersist_cpu.py); use "
                             "engine=fastpersist (the same writer, synchronous), engine=lazy, engine=torchsnapshot "
                             "async_take=true or engine=dcp async_save=true on CPU")

    def prepare(self) -> None:
        super().prepare()
        deepspeed_decoupled_cause.install()  # a dead writer process's error reaches the rank's

    def open(self, ctx: EngineContext) -> CheckpointIO:
        return DecoupledIO(ctx.native, ctx.target, self.options.io_multiplier)


class DecoupledIO(WriterIO):
    """DeepSpeed's DecoupledCheckpointEngine: its writer process makes the file, named as the FastPersist writer
    names it (`X.pt-R.N` with ZeRO < 3); a rank without a writer process writes nothing."""

    def __init__(self, native, target, io_multiplier: int):
        super().__init__(native, target)
        self.io_multiplier = io_multiplier

    def save(self, state, path):
        # DeepSpeed's save would return as if written (its writer is gone)
        if why := deepspeed_decoupled_cause.died(self.native):
            raise RuntimeError(why)
        self.native.save(detached(state), path)
        config = self.native.dp_writer_config
        if config is None:
            return []
        if not self.native.optimize_dp_state:
            return [path]
        return [cpu_writer.replica_name(path, config.rank, config.world_size * self.io_multiplier)]
