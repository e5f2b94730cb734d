"""What a sampled stack was doing, named the way a user acts on it (an import of package P, a JIT build of op O, a
collective's wait, ...): rules tried in order, the first that matches names the sample; one that none matches is the
remainder. The order, the kinds and what to do about each: docs/attribution.md#the-causes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from restart_harness.schema import ANCHOR_PREFIX

# kind -> what it is, for the docs and the figure's legend (in the order the figure stacks them)
KINDS = {
    "import": "imports of Python packages (module bodies, their shared libraries)",
    "jit_op": "DeepSpeed ops: compatibility probes, JIT builds and loads",
    "process_group": "process groups: rendezvous, communicator creation",
    "collective": "waits in collectives (on the slowest rank)",
    "cuda": "the CUDA context and device set-up",
    "model": "model construction and its placement (parameters, sharding, broadcast)",
    "optimizer": "optimizer construction (ZeRO partitioning, flat buffers, states)",
    "checkpoint": "checkpoint reads and deserialization",
    "training": "training work (forward, backward, optimizer step)",
    "launcher": "the launcher's own work (starting processes, its set-up)",
    "harness": "the harness's own work (event log, probes, the sampler's anchors)",
    "other": "named work of no kind above (DeepSpeed's config, ...)",
    "remainder": "samples no rule names, and time the sampler did not see"}
EXCLUDED = "excluded"  # the verification digest: timed apart, outside every phase


@dataclass(frozen=True)
class Cause:
    kind: str
    name: str
    via: str = field(default="", compare=False)  # where it came from (who imported), not part of the name
    part: str = field(default="", compare=False)  # which part of it (the package whose module body ran)


# the launcher's phase before the sampler's first sample: no stack, but known work (rundir/sampling.py starts the
# launch script under the sampler)
BEFORE_SAMPLING = Cause("launcher", "the launch script's shell and the sampler starting (before its first sample)")

_SITE = re.compile(r"(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python3\.\d+/")
_DEEP = {"torch", "deepspeed", "transformers"}
_HARNESS = re.compile(r"/(restart_harness|engines|third_party)/")
_COLLECTIVES = {"barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
                "isend", "irecv", "reduce", "monitored_barrier", "all_gather_object", "broadcast_object_list",
                "wait", "all_true"}
_GROUP_CREATION = {"init_process_group", "new_group", "_new_group_with_tag", "_new_process_group_helper",
                   "new_subgroups", "init_device_mesh", "_init_process_groups"}


def relative(file: str) -> str:
    """A frame's file as a reader knows it: under site-packages, or under the harness's checkout."""
    if m := _SITE.search(file):
        return file[m.end():]
    return file[m.start() + 1:] if (m := _HARNESS.search(file)) else file


def module_of(file: str) -> str:
    """A module body's dotted name from its file (deepspeed/ops/__init__.py -> deepspeed.ops; the standard
    library's under `stdlib`)."""
    path = relative(file)
    if m := _STDLIB.search(path):
        path = "stdlib/" + path[m.end():]
    elif path.startswith("<frozen "):
        path = "stdlib/" + path[len("<frozen "):].rstrip(">")
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def package_of(file: str) -> str:
    """The package an import is charged to: the top-level one, or its subpackage for the few large enough that
    which part matters (torch._dynamo, not torch)."""
    parts = module_of(file).split(".")
    return ".".join(parts[:2] if parts[0] in _DEEP and len(parts) > 2 else parts[:1])


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _in(frame, fragment: str) -> bool:
    return fragment in frame.file


def classify(frames, launcher: bool = False) -> Cause:
    """The cause of one sample (frames outermost first, py-spy's process frames included); `launcher`: a sample of
    a launcher's process, not a rank's."""
    py = [f for f in frames if f.file or f.name.startswith("0x") or "(" in f.name]
    if not py:
        return Cause("remainder", "no Python frame (the interpreter starting or exiting)")
    for rule in _LAUNCHER_RULES if launcher else _RULES:
        cause = rule(py)
        if cause is not None:
            return cause
    return Cause("remainder", "unnamed: " + _innermost_named(py))


def _innermost_named(frames) -> str:
    for f in reversed(frames):
        if f.file and not f.file.startswith("<frozen"):
            return f"{_short(f.name)} ({relative(f.file)})"
    return _short(frames[-1].name)


def _anchor(frames):
    hit = any(f.name.startswith(ANCHOR_PREFIX) for f in frames)
    return Cause("harness", "the sampler's clock anchors (attribution=)") if hit else None


def _verification(frames):
    hit = any(_short(f.name) == "verify" and "/stacks/" in f.file for f in frames)
    return Cause(EXCLUDED, "the harness's verification digest (timed apart)") if hit else None


def _op(frames):
    """DeepSpeed's op builders at work (deepspeed/ops/op_builder/: a builder's methods, not the modules' bodies that
    an import of DeepSpeed runs) and torch's JIT extension loader."""
    builder = [f for f in frames if "/op_builder/" in f.file and "." in f.name
               and f.name.split(".", 1)[0].endswith("Builder")]
    jit = [f for f in frames if _in(f, "torch/utils/cpp_extension.py") and f.name != "<module>"]
    if not builder and not jit:
        return None
    op = next((f.file.rsplit("/", 1)[-1][:-3] for f in reversed(builder)
               if f.file.rsplit("/", 1)[-1] not in ("builder.py", "__init__.py", "all_ops.py")), None)
    if op is None:  # the generic builder's frames only: the caller names the op
        first = frames.index((builder or jit)[0])
        caller = frames[first - 1] if first else frames[0]
        op = f"of {_short(caller.name)} ({relative(caller.file)})"
    names = {_short(f.name) for f in builder + jit}
    if any(_in(f, "torch/utils/file_baton.py") for f in frames):
        what = "waiting for another process's JIT build (torch's build lock)"
    elif names & {"_run_ninja_build", "_write_ninja_file_and_build_library", "build"}:
        what = "JIT build, or ninja's check that it is up to date"
    elif names & {"is_compatible", "has_function", "compatible_ops", "_probe_compatible_ops"}:
        what = "compatibility probe (a C compiler test build)"
    else:
        what = "load"
    return Cause("jit_op", f"op {op}: {what}")


def _native(frames):
    """Native frames (attribution=native)."""
    for f in reversed(frames):
        if "ncclCommInit" in f.name or "ncclCommSplit" in f.name:
            return Cause("process_group", "NCCL communicator creation")
        if f.name.startswith(("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxCreate")):
            return Cause("cuda", "CUDA context creation")
    return None


def _import(frames):
    first = next((i for i, f in enumerate(frames) if f.file.startswith("<frozen importlib")), None)
    if first is None:
        return None
    bodies = [f for f in frames[first:] if f.name == "<module>"]
    # none: still finding the module, charged to the importing module's own import statement
    inner = bodies[-1] if bodies else next((f for f in reversed(frames[:first]) if f.name == "<module>"), None)
    if inner is None:  # no module body on the stack at all: the search for the first one (runpy's -m)
        return Cause("import", "import (finding modules on sys.path)")
    package, module = package_of(inner.file), module_of((bodies[0] if bodies else inner).file)
    # who asked: the frame before the import machinery (importlib.import_module's own frame is machinery too)
    at = first - 1
    while at >= 0 and frames[at].file.endswith("importlib/__init__.py"):
        at -= 1
    importer = frames[at] if at >= 0 else None
    via = f"{_short(importer.name)} ({relative(importer.file)})" if importer is not None else "?"
    if importer is not None and relative(importer.file).startswith("torch/"):  # torch's lazy imports: who called
        at = next((i for i in range(at - 1, -1, -1) if frames[i].file and not frames[i].file.startswith("<")
                   and not relative(frames[i].file).startswith(("torch/", "/"))), None)
        if at is not None:
            entry = frames[at + 1]  # the torch function it called
            via += (f", called from {_short(frames[at].name)} ({relative(frames[at].file)}) through "
                    f"{module_of(entry.file)}.{entry.name}")
    return Cause("import", "import (the standard library)" if module.startswith("stdlib") else f"import {module}",
                 via, "the standard library" if package == "stdlib" else package)


def _cuda(frames):
    if any(_short(f.name) in ("_lazy_init", "init") and _in(f, "torch/cuda/") for f in frames):
        return Cause("cuda", "CUDA context creation (torch.cuda's lazy init)")
    if any(_in(f, "torch/cuda/") and _short(f.name) in ("set_device", "synchronize") for f in frames):
        return Cause("cuda", "CUDA device set-up and synchronization")
    return None


def _process_group(frames):
    last = frames[-1]
    if _in(last, "deepspeed/comm/torch.py") and _short(last.name) == "__init__":
        # TorchBackend.__init__'s own native call: shm_comm_op.initialize, which sets up the node's shared memory and
        # waits for every local rank to reach it (the others' dist_init: a JIT build, imports)
        return Cause("process_group", "DeepSpeed's shared-memory op joining the node's ranks (waits for each of them)")
    for f in frames:
        if _in(f, "torch/distributed/rendezvous.py"):
            return Cause("process_group", "rendezvous (the TCP store on rank 0)")
        if _in(f, "torch/distributed/") and _short(f.name) in _GROUP_CREATION:
            return Cause("process_group", f"process group creation ({_short(f.name)})")
    return None


def _collective(frames):
    for f in frames:
        name = _short(f.name)
        if name in _COLLECTIVES and (_in(f, "torch/distributed/") or _in(f, "deepspeed/comm/")
                                     or "/stacks/" in f.file or "/worker/" in f.file):
            return Cause("collective", f"waiting in {name} (on the other ranks)")
    return None


def _checkpoint(frames):
    for i, f in enumerate(frames):
        if "/engines/" in f.file and _training(frames[i + 1:]) is not None:
            continue  # an engine's wrapper around a training call (engine=lazy's take_model_step): the call's work
        if _in(f, "torch/serialization.py"):
            return Cause("checkpoint", f"torch.{'load' if 'load' in f.name else 'save'} (files and deserialization)")
        if _in(f, "torch/distributed/checkpoint/"):
            return Cause("checkpoint", "torch Distributed Checkpoint (plans, reads, copies)")
        if "/engines/" in f.file or _in(f, "deepspeed/runtime/checkpoint_engine/") or _short(f.name) in (
                "load_checkpoint", "_load_checkpoint", "load_module_state_dict", "_load_zero_checkpoint"):
            return Cause("checkpoint", f"the checkpoint engine ({_short(f.name)}, {relative(f.file)})")
    return None


def _optimizer(frames):
    for f in frames:
        if ((_in(f, "deepspeed/runtime/zero/") or _in(f, "deepspeed/runtime/bf16_optimizer.py"))
                and (_short(f.name) == "__init__" or "partition" in f.name)):
            return Cause("optimizer", f"ZeRO optimizer set-up ({relative(f.file).rsplit('/', 1)[-1]})")
        if _in(f, "deepspeed/runtime/engine.py") and "_configure" in f.name and "optimizer" in f.name:
            return Cause("optimizer", "optimizer construction (DeepSpeed's _configure_optimizer)")
        if (_in(f, "torch/optim/") or _in(f, "deepspeed/ops/adam/")) and _short(f.name) == "__init__":
            return Cause("optimizer", f"optimizer construction ({f.name.split('.', 1)[0]})")
    return None


def _training(frames):
    names = [(_short(f.name), f) for f in frames]
    if any(n == "backward" for n, _ in names):
        return Cause("training", "backward")
    if any(n in ("step", "_take_model_step") and (_in(f, "torch/optim/") or _in(f, "deepspeed/runtime/"))
           for n, f in names):
        return Cause("training", "optimizer step")
    if any(n == "forward" for n, _ in names) or any(n == "train_step" for n, _ in names):
        return Cause("training", "forward")
    return None


def _model(frames):
    for f in frames:
        name = _short(f.name)
        if name == "fully_shard" or _in(f, "torch/distributed/fsdp/"):
            return Cause("model", "FSDP2's fully_shard (sharding the model)")
        if _in(f, "deepspeed/runtime/engine.py") and name in ("_configure_distributed_model", "_broadcast_model"):
            return Cause("model", "the model to its device, parameters broadcast from rank 0")
        if _in(f, "deepspeed/runtime/pipe/module.py") and name in ("__init__", "_build"):
            return Cause("model", "model construction (pipeline stages)")
        if _in(f, "torch/nn/init.py") or ("/model/" in f.file and _HARNESS.search(f.file) and name == "__init__"):
            return Cause("model", "model construction (layers, parameter initialization)")
    return None


def _launcher(frames):
    names = {_short(f.name) for f in frames}
    if names & {"_execute_child", "_fork_exec", "fork"}:
        return Cause("launcher", "starting the ranks' processes")
    if names & {"wait", "_wait", "_try_wait", "poll", "sleep", "communicate", "waitpid"}:
        return Cause("launcher", "waiting on its child processes")
    return Cause("launcher", "its own set-up (arguments, environment, host file)")


def _prefork(frames):
    """launcher=prefork's forking process, seen from a rank's phase that began in it (its imports)."""
    inner = next((f for f in reversed(frames) if f.file and not f.file.startswith("<")), None)
    hit = inner is not None and inner.file.endswith("/worker/forker.py")
    return Cause("launcher", "prefork: forking the ranks") if hit else None


def _harness(frames):
    hit = any(re.search(r"/worker/(eventlog|memory|io_marks|anatomy)\.py", f.file) for f in frames)
    return Cause("harness", "the harness's event log and probes") if hit else None


def _config(frames):
    if any(_in(f, "deepspeed/runtime/config") for f in frames):
        return Cause("other", "DeepSpeed's configuration (parsed, checked, printed)")
    setup = next((_short(f.name) for f in frames if _in(f, "deepspeed/runtime/engine.py")
                  and _short(f.name).startswith(("_configure", "_do_sanity"))), None)
    return Cause("other", f"DeepSpeed engine set-up ({setup})") if setup else None


_RULES = (_anchor, _verification, _op, _native, _import, _prefork, _cuda, _process_group, _collective, _checkpoint, _optimizer,
          _training, _model, _harness, _config)
_LAUNCHER_RULES = (_op, _import, _launcher)
