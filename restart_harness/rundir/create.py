"""A new run directory: claimed exclusively, then spec.json (the resolved run), ds_config.json (its ZeRO stage, torch
AdamW, bf16 or fp32, plus the engine's block) and the launch scripts written into it before anything launches."""

from __future__ import annotations

import copy
import dataclasses
import random
import socket
from datetime import datetime
from pathlib import Path

from restart_harness import machine
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic
from restart_harness.files.exclusive import claim_dir
from restart_harness.resolve import Plugins, Run, placed
from restart_harness.rundir import observe
from restart_harness.rundir.scripts import write_launch
from restart_harness.rundir.status import set_status
from restart_harness.schema import stack_engine


def new_run_dir(plugins: Plugins, prefix: str = "") -> Path:
    """results/<model>-<layout>-<engine label>-<time>, created exclusively: a run never reuses another's folder."""
    spec = plugins.spec
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = "-".join(stack_engine(dataclasses.asdict(spec)))
    base = prefix + f"{spec.model_label}-{spec.layout}-{label}-{stamp}".replace("/", "_")
    try:
        return claim_dir(Path(spec.results_dir), base)
    except FileExistsError as exc:
        raise RunFailed(str(exc)) from None


def free_port() -> int:
    """A rendezvous port free now. Drawn at random from the dynamic range and tried, not bind(0)'s: two harnesses
    started at the same moment got the same port from bind(0) here (both probes closed before either rank bound it),
    and the second run failed with EADDRINUSE."""
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randint(20000, 32767)  # below Linux's ephemeral range (32768-60999), where clients' ports come from
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_of(run: Plugins) -> int:
    """The rendezvous port of a launch: master_port=, or a free one."""
    return run.spec.master_port or free_port()


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def build_ds_config(plugins: Plugins) -> dict:
    """ds_config.json contents; the engine plug-in may add its own block (datastates_ckpt, checkpoint.writer)."""
    spec = plugins.spec
    config = {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "zero_optimization": {"stage": spec.zero},
        "optimizer": {
            "type": "AdamW",
            # torch_adam: FusedAdam needs CUDA; torch's AdamW is the same math on every device.
            "params": {"lr": spec.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                       "torch_adam": True}},
        "gradient_clipping": 1.0,
        "bf16": {"enabled": spec.precision == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False}
    return deep_merge(config, plugins.engine.ds_config())


def prepare(plugins: Plugins, prefix: str = "") -> Run:
    """The run directory with spec.json, ds_config.json and the launch scripts; returns the Run spec.json records."""
    run_dir = new_run_dir(plugins, prefix)
    set_status(run_dir, "running")
    target = plugins.target.placed(run_dir)
    facts = machine.facts(target.root.parent)
    run = placed(plugins, run_dir, facts, target)
    facts["io_sources"] = observe.sources_facts(run_dir, run.checkpoint_root)
    run.write()
    write_json_atomic(run_dir / "ds_config.json", build_ds_config(run))
    write_scripts(run, port_of(run))
    return run


def write_scripts(run: Run, port: int) -> None:
    """The checkpoint phase's launch script and, with phase=all, the first restart's (written now so that it can be
    read (dry_run) and re-run by hand; claimed when it is launched)."""
    write_launch(run, "checkpoint", "checkpoint", port)
    if run.spec.phase == "all":
        write_launch(run, "restart", "restart-01", port)
