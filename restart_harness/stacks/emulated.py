"""emulate=true: DeepSpeed's checkpoint of the planned model and layout without a model and without training, written
through the chosen engine's own save (stacks/_deepspeed_files.py, stacks/_streamed.py) and read back in DeepSpeed's
order, every tensor verified; generating data, waiting for a wave and verifying are not timed. docs/emulation.md."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

from engines.base import Engine, NativeIO
from restart_harness.errors import UsageError
from restart_harness.files.atomic import write_json_atomic
from restart_harness.plan import checkpoint
from restart_harness.rank_env import barrier
from restart_harness.stacks.base import Rank, Stack, Verification
from restart_harness.stacks.deepspeed import DeepSpeedStack, client_state, ds_config_path, init_distributed
from restart_harness.targets.base import POSIX


def streamable(engine: type) -> bool:
    """Can emulation stream this engine's files? Where the engine saves through DeepSpeed's own checkpoint engine as
    it is (it opens none of its own): an emulated rank's is TorchCheckpointEngine, that is torch.save."""
    return engine.open is Engine.open


def native_engine():
    """DeepSpeed's TorchCheckpointEngine with the zip serialization DeepSpeed configures by default, able to stream
    the emulated files (stacks/_streamed.py)."""
    from deepspeed.runtime.model_checkpointing.constants import CHECKPOINT_SERIALIZATION_DEFAULT

    from restart_harness.stacks._streamed import StreamedTorchEngine

    native = StreamedTorchEngine()
    native.zipfile_serialization = CHECKPOINT_SERIALIZATION_DEFAULT
    return native


class EmulatedRank(Rank):
    untimed: ClassVar[dict[str, tuple[str, ...]]] = {"save": ("generate", "wave"), "load": ("verify", "wave")}

    def start(self) -> None:
        self.device = init_distributed(self.spec)

    def build(self) -> dict:
        self.recipes = checkpoint.recipes(self.spec)
        self.config = json.loads(ds_config_path(self.run).read_text())
        self.waves, self.wave_start, self.wave_end = 0, None, None
        self._verification: Verification | None = None
        spec, rank = self.spec, self.rank
        return {"dp_rank": (rank // spec.tp) % spec.dp, "tp_rank": rank % spec.tp,
                "pp_rank": rank // (spec.tp * spec.dp), "device": str(self.device), "local_parameters": 0,
                "emulated": True}

    def engine_context(self) -> dict:
        self.native = native_engine()
        return {"native": self.native}

    def attach(self, recorder) -> None:
        self.streamable = type(recorder.io) is NativeIO and recorder.native is self.native
        self.streamed = self.native.streams = checkpoint.emulation_streams(self.spec, self.streamable)

    def _in_waves(self, work, untimed) -> None:
        """Run work() in this rank's wave; every rank takes part in every wave's barrier."""
        import torch.distributed as dist

        at_once, self.waves = checkpoint.waves(self.spec, self.streamable)
        mine = checkpoint.wave_of(self.rank, self.spec.ranks_per_node, at_once)
        for wave in range(self.waves):
            if wave == mine:
                self.wave_start = time.time()  # this rank's wave: its files written (made durable after all waves)
                work()
                self.wave_end = time.time()
            if self.waves > 1:
                with untimed("wave"):
                    dist.barrier()

    def save(self, root, tag, step, io, untimed) -> dict:
        from restart_harness.model import digest
        from restart_harness.stacks._deepspeed_files import Filler, build_state, tensors_of
        from restart_harness.stacks._streamed import Fill

        tag_dir, carried = Path(root) / tag, client_state(self.spec, step)
        if self.rank == 0:
            tag_dir.mkdir(parents=True, exist_ok=True)
        barrier()
        with untimed("generate"):  # the random pool: data generation, not the save
            filler = Filler(self.rank, self.spec.seed, lazy=self.streamed)
        digests: dict[str, dict[str, str]] = {}

        def work() -> None:
            for recipe in (r for r in self.recipes if r.writer == self.rank):
                with untimed("generate"):
                    filler.fills.clear()
                    state = build_state(self.spec, recipe, filler, self.config, carried)
                    if self.streamed:  # the data is made as it is written, and digested then
                        self.native.fill = Fill(state, filler, dict(filler.fills), untimed)
                    else:
                        digests[recipe.path] = {k: digest.tensor_digest(t) for k, t in tensors_of(state).items()}
                io.save(state, str(tag_dir / recipe.path))
                io.flush()  # one file's state in memory at a time, asynchronous engines included
                if self.streamed:
                    digests[recipe.path], self.native.fill = self.native.fill.digests, None
                del state

        self._in_waves(work, untimed)
        path = self.run.run_dir / "digests" / tag / f"emulated-rank-{self.rank:05d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with untimed("generate"):
            write_json_atomic(path, {"tag": tag, "rank": self.rank, "files": digests})
        return {"emulated": True, "streamed": self.streamed, "waves": self.waves, "wave_start": self.wave_start,
                "wave_end": self.wave_end}

    def load(self, root, tag, io, untimed) -> dict:
        """This rank's restart read set, one file at a time, in DeepSpeed's order (and in the save's memory waves),
        each tensor verified against the digest its writer recorded."""
        from restart_harness.model import digest
        from restart_harness.stacks._deepspeed_files import tensors_of

        tag_dir = Path(root) / tag
        saved: dict[str, dict[str, str]] = {}
        for path in sorted((self.run.run_dir / "digests" / tag).glob("emulated-rank-*.json")):
            saved.update(json.loads(path.read_text())["files"])
        sequence = checkpoint.restart_read_sequence(self.spec)[self.rank]
        self.native.untimed = untimed  # a streamed load digests each chunk as it arrives, outside the load's time
        differing: list[str] = []
        counts = {"checked": 0, "seconds": 0.0}

        def work() -> None:
            for name in sequence:
                state = io.load(str(tag_dir / name), map_location="cpu")
                with untimed("verify"):
                    started = time.perf_counter()
                    found = (self.native.digests if self.streamed else
                             {key: digest.tensor_digest(t) for key, t in tensors_of(state).items()})
                    counts["checked"] += len(found)
                    mine = saved.get(name, {})
                    differing.extend(f"{name}:{key}" for key, value in found.items() if mine.get(key) != value)
                    counts["seconds"] += time.perf_counter() - started
                del state

        self._in_waves(work, untimed)
        ok = not differing and counts["checked"] > 0
        self._verification = Verification(tag, ok, differing, counts["checked"], counts["seconds"])
        return {"harness_step": self.spec.iters}

    def record_digests(self, tag: str) -> None:
        return None  # taken file by file while the save generates them

    def verify(self, tag: str, reference: Path | None) -> Verification:
        return self._verification


class EmulatedStack(Stack):
    name = "emulated"
    description = "emulate=true: DeepSpeed's files of the planned checkpoint written and read back, no model"
    default_engine = "default"
    planned = True
    trains = False
    key_text = "emulate=true"
    Rank = EmulatedRank

    @classmethod
    def accepts_engine(cls, engine: type) -> bool:
        return engine.emulates

    @classmethod
    def check(cls, spec, engine, target) -> None:
        if not cls.accepts_engine(engine):
            from engines import registry  # every engine, listed (no lookup by name)

            takers = ", ".join(n for n, c in registry.all_engines().items() if cls.accepts_engine(c))
            raise UsageError(f"emulate=true cannot emulate engine={engine.name}: DeepSpeed builds that engine from its "
                             f"own config inside deepspeed.initialize; accepted with emulate=true: {takers}")
        if target.kind != POSIX:
            raise UsageError(f"ckpt_dir={spec.ckpt_dir}: emulate=true writes to a file system, not to object storage; "
                             "accepted: a file-system ckpt_dir, or emulate=false with this one (a run; mlperf "
                             "always emulates)")
        if spec.stack != DeepSpeedStack.name:
            raise UsageError(f"emulate=true: emulation writes {DeepSpeedStack.name}'s files; accepted with "
                             f"stack={DeepSpeedStack.name} only")
        DeepSpeedStack.check(spec, engine, target)
        if not spec.subset:
            return
        ranks = range(spec.ranks_per_node)  # the first node's ranks must find every file they read among their own
        written = {r.path for r in checkpoint.recipes(spec) if r.writer in ranks}
        for rank in ranks:
            missing = [name for name in checkpoint.restart_read_sequence(spec)[rank] if name not in written]
            if missing:
                raise UsageError(f"subset=true: rank {rank} of {spec.layout} reads {missing[0]} at a restart, which "
                                 f"a rank outside the first {spec.ranks_per_node} writes; accepted: a layout whose "
                                 "first node reads only its own files (e.g. more ranks per node)")

    @classmethod
    def check_relayout(cls, original, spec, engine, target, saves) -> None:
        raise UsageError(f"restart at another layout ({original.layout} -> {spec.layout}): an emulated checkpoint "
                         "holds random data, not a trained state; accepted: runs trained with emulate=false")

    @classmethod
    def imports(cls, later: bool = False) -> None:  # no optimizer, no deepspeed.initialize: nothing imported later
        DeepSpeedStack.imports()
