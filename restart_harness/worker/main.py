"""One rank of one phase, whatever the training stack: join the process group, build, then train and checkpoint (phase
checkpoint) or load the committed checkpoint, verify it and train on (phase restart); every fact to its event log."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from restart_harness import faults, resolve
from restart_harness.rank_env import barrier
from restart_harness.schema import Done, Error, Layout, Process, Step, Verify
from restart_harness.targets.base import PER_RANK_DIRS
from restart_harness.worker.anatomy import Anatomy
from restart_harness.worker.eventlog import Anchors, EventLog
from restart_harness.worker.io_marks import IOProbe
from restart_harness.worker.manager import CheckpointManager
from restart_harness.worker.memory import MemoryProbe, added
from third_party import dftracer_compat


@dataclass(frozen=True)
class RankJob:
    """What a launch script asks of each rank."""

    run_dir: Path
    phase: str  # checkpoint | restart
    record: str  # the event folder: checkpoint, restart-01, ...
    load_tag: str | None = None  # restart: the tag to load (a converted copy); default what `latest` names
    reference: Path | None = None  # restart: verify the full state against these digests (another layout)
    train_on: bool = False  # restart: then train to `iters`, saving at every save_interval (a failure campaign)

    @classmethod
    def parse(cls, argv=None) -> RankJob:
        p = argparse.ArgumentParser(description=__doc__)
        p.add_argument("--run-dir", type=Path, required=True)
        p.add_argument("--phase", choices=("checkpoint", "restart"), required=True)
        p.add_argument("--record", required=True)
        p.add_argument("--load-tag")
        p.add_argument("--full-state-reference", type=Path, dest="reference")
        p.add_argument("--train-on", action="store_true")
        return cls(**vars(p.parse_args(argv)))


def main(process_start: float, argv=None, forked: bool = False) -> int:
    """One rank; `forked`: forked from a process that imported for it (launcher=prefork: worker/io_marks.py)."""
    job = RankJob.parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    for name in os.environ.get(PER_RANK_DIRS, "").split():  # a storage client's log: one folder per rank
        if os.environ.get(name):
            os.environ[name] = str(Path(os.environ[name]) / f"rank-{rank:05d}")
    memory = MemoryProbe()
    log = EventLog(job.run_dir / "events" / job.record / f"rank-{rank:05d}.jsonl", rank,
                   (memory.phase_peaks, IOProbe(forked, owns=os.environ.get("LOCAL_RANK") == "0").phase),
                   Anchors.of_launch())
    node = os.environ.get("CROSS_RANK")
    log.emit(Process(os.getpid(), socket.gethostname(), int(node) if node and node.isdigit() else None,
                     threading.main_thread().ident))
    log.mark("process_start", t=process_start)
    try:
        the_run = resolve.read(job.run_dir, job.record)
        the_run.stack.imports()  # torch, the stack's own libraries: the `imports` phase
        log.mark("imports_done")
        run(job, the_run, log, rank, memory)
        # Linux reports ru_maxrss in KiB: the peak resident memory of this rank's process.
        log.emit(Done(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
        return 0
    except BaseException as exc:  # recorded for the summary, then re-raised so the launch fails
        log.emit(Error(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        raise
    finally:
        log.close()


def end_process(code: int):
    """Exit now, without the interpreter's teardown (freeing torch's and DeepSpeed's modules: 1.2-1.5 CPU-seconds a
    process, docs/testing.md); every save is durable before `main` returns. Python's and C's buffered output first."""
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)
    os._exit(code)


def run(job: RankJob, the_run: resolve.Run, log: EventLog, rank: int, memory: MemoryProbe) -> None:
    spec, engine = the_run.spec, the_run.engine
    stack = the_run.stack.Rank(the_run, rank, log)
    stack.start()
    log.mark("dist_init_done")
    engine.prepare()
    layout = stack.build()
    anatomy = Anatomy(stack.device.type, enabled=spec.anatomy)
    target = the_run.store(anatomy)
    anatomy.counters.add_prefix(target.root)
    stack.hook(anatomy)
    manager = None
    if engine.saves:
        from engines.base import EngineContext

        io = engine.open(EngineContext(spec, target, storage=_storage(the_run), **stack.engine_context()))
        manager = CheckpointManager(stack, engine, io, target, anatomy, log, memory)
    import torch  # its intra-op threads: OMP_NUM_THREADS from the launch script (the spec's `threads`)

    log.emit(Layout.of({**layout, "threads": torch.get_num_threads()}))

    first, last = 1, spec.iters
    fresh = job.train_on and target.latest() is None  # a campaign's job that failed before its first commit
    if job.phase == "restart" and not fresh:
        tag, client_state = manager.load(job.load_tag)
        log.emit(Verify(stack.verify(tag, job.reference).event()))
        first = int(client_state["harness_step"]) + 1
        last = spec.iters if job.train_on else first + spec.after - 1
    else:
        log.mark("engine_initialized")

    saving = manager is not None and (job.phase == "checkpoint" or job.train_on)
    if the_run.stack.trains:
        for step in range(first, last + 1):
            faults.hit("step", rank, step, where=str(target.root))
            window = memory.open()
            start = time.perf_counter()
            loss = stack.train_step(step)
            seconds = time.perf_counter() - start
            memory.close(window)
            log.emit(Step(step, loss, seconds, last, manager.overlapped(start) if manager else False,
                          added(window.peak_rss, window.start_rss), window.start_rss))
            if step == first and job.phase == "restart":
                log.mark("first_step_done")
            if manager:
                manager.poll()  # an async save commits at the first step boundary where all are durable
            if saving and step % spec.save_interval == 0:
                manager.finish()  # never two flushes in flight
                manager.save(step)
    elif saving:  # a stack that trains nothing saves at the steps a training run would (spec.save_steps)
        for step in spec.save_steps():
            manager.save(step)
    if manager:
        manager.finish()
    barrier()  # the phase is over on this rank (after the last save is committed)
    log.mark("finished")
    if spec.trace:
        dftracer_compat.finish(barrier)


def _storage(the_run: resolve.Run) -> dict | None:
    """The run's storage probe (baseline.json, written before the checkpoint phase), or None without one."""
    try:
        record = json.loads((the_run.run_dir / "baseline.json").read_text())
    except (OSError, ValueError):
        return None
    return None if not isinstance(record, dict) or record.get("error") else record
