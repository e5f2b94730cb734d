#!/usr/bin/env bash
# Compile every CUDA part of the offline bundle on a machine that has CUDA's compiler but no GPU (a login node, this
# project's machines): the bundle's own CUDA path (gather.sh, then install.sh --cuda yes) against a CUDA build of
# torch, then what can be imported without a driver. Nothing built here can run (no GPU): it proves the builds.
#
#   scripts/bundle/check-cuda-build.sh DATASTATES_SRC [--torch VERSION] [--arch LIST] [--work DIR] [--datastates-only]
#
#   DATASTATES_SRC  a DataStates-LLM source tree or a .tar.gz of one (gather.sh --datastates), or `none`
#   --torch         the CUDA build of torch to compile against (default 2.14.1: on this project's machines pip takes
#                   2.14.1+cu130 from the machine's disk); its CUDA major version must be nvcc's
#   --arch          TORCH_CUDA_ARCH_LIST: the GPUs to compile for, there being none to ask (default "8.0;9.0":
#                   A100, H100/H200)
#   --work          where the bundle, the environment and the logs go (default: a new folder under /tmp; kept)
#   --datastates-only  DeepSpeed installed without its CUDA ops (install.sh --deepspeed-ops none): DataStates-LLM is
#                   the one part compiled (minutes, not the half hour DeepSpeed's ops take on 2 cores)
#
# Prints one line per part: compiled / imported / not built, with the compiler's error where one failed; exit 0 when
# every part that was asked for compiled. Result and date: docs/clusters.md ("CUDA builds, checked without a GPU").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
die() { echo "error: $*" >&2; exit 2; }
log() { echo "[cuda-build] $*" >&2; }
[[ $# -ge 1 ]] || die "usage: scripts/bundle/check-cuda-build.sh DATASTATES_SRC|none [--torch VERSION] [--arch LIST] [--work DIR] [--datastates-only]"
SRC="$1"; shift
TORCH=2.14.1 ARCH="8.0;9.0" WORK="" OPS=auto
while [[ $# -gt 0 ]]; do
  case "$1" in
    --torch) TORCH="${2:?}"; shift 2 ;;
    --arch) ARCH="${2:?}"; shift 2 ;;
    --work) WORK="${2:?}"; shift 2 ;;
    --datastates-only) OPS=none; shift ;;
    *) die "unknown option $1; accepted: --torch VERSION, --arch LIST, --work DIR, --datastates-only" ;;
  esac
done
[[ "$SRC" == none || -e "$SRC" ]] || die "$SRC: no such source folder or tarball; accepted: a DataStates-LLM source tree, a .tar.gz of one, or none"
command -v nvcc >/dev/null || die "nvcc not found: CUDA's compiler is what this check needs"
NVCC_MAJOR="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
WORK="${WORK:-$(mktemp -d /tmp/rh-cuda-build.XXXXXX)}"
mkdir -p "$WORK"; WORK="$(cd "$WORK" && pwd)"
[[ -z "$(ls -A "$WORK" 2>/dev/null)" ]] || die "$WORK is not empty"
log "work folder $WORK; nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p'); torch $TORCH; arch $ARCH"

start=$(date +%s)
log "gathering the bundle (torch $TORCH, DeepSpeed's source distribution, DataStates-LLM: $SRC)"
"$ROOT/scripts/bundle/gather.sh" "$WORK/bundle" --torch-version "$TORCH" --datastates "$SRC" --any-datastates-api \
  2>"$WORK/gather.err" \
  || { cat "$WORK/gather.err" >&2; die "gather.sh failed"; }
log "installing with --cuda yes (DeepSpeed's CUDA ops and DataStates-LLM compile now; several minutes on 2 cores)"
TORCH_CUDA_ARCH_LIST="$ARCH" "$ROOT/scripts/bundle/install.sh" "$WORK/bundle" "$WORK/dest" --cuda yes --deepspeed-ops "$OPS" \
  2>"$WORK/install.err" || true
VPY="$WORK/dest/.venv/bin/python"
[[ -x "$VPY" ]] || { cat "$WORK/install.err" >&2; die "install.sh made no environment"; }
TORCH_CUDA="$("$VPY" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)"
log "torch $("$VPY" -c 'import torch; print(torch.__version__)') (CUDA ${TORCH_CUDA:-none}); nvcc's major $NVCC_MAJOR"
[[ "${TORCH_CUDA%%.*}" == "$NVCC_MAJOR" ]] || die "torch's CUDA (${TORCH_CUDA:-none}) is not nvcc's major ($NVCC_MAJOR)"

# what each part became: DeepSpeed's prebuilt ops are importable modules of the wheel; DataStates-LLM's core
rc=0
"$VPY" - "$WORK" "$SRC" "$OPS" <<'PYEOF' || rc=$?
import importlib, json, os, re, sys
from pathlib import Path

work, src, ops_asked = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
log = (work / "dest" / ".venv" / "install.log").read_text(errors="replace")
parts, failed = [], False


def first_error(text):
    for line in text.splitlines():
        if re.search(r"\berror\b", line) and "error: subprocess" not in line:
            return line.strip()[:300]
    return "see " + str(work / "dest" / ".venv" / "install.log")


os.environ["DS_ACCELERATOR"] = "cuda"  # the accelerator the ops were built for, as on a GPU node
try:
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops import op_builder
    ops = (("async_io", "AsyncIOBuilder"), ("pin_memory", "PinMemoryBuilder"), ("fused_adam", "FusedAdamBuilder"))
    if ops_asked == "none":
        ops = ()
        parts.append(("DeepSpeed ops", "not asked (--datastates-only)"))
except Exception as exc:  # noqa: BLE001
    failed, ops = True, ()
    parts.append(("DeepSpeed", f"not installed: {first_error(log)} ({type(exc).__name__}: {exc})"))
for op, builder in ops:
    compiled = list((work / "dest" / ".venv").rglob(f"{op}_op*.so"))
    if not compiled or not installed_ops.get(op):  # never JIT-built here: only what the install built counts
        failed = True
        parts.append((f"DeepSpeed op {op}", "not built: " + first_error(log)))
        continue
    try:  # through DeepSpeed's own loader, which takes the installed op (async_io: pin_memory's first)
        getattr(op_builder, builder)().load(verbose=False)
        parts.append((f"DeepSpeed op {op}", "compiled; loaded by DeepSpeed without a driver"))
    except Exception as exc:  # noqa: BLE001
        parts.append((f"DeepSpeed op {op}", f"compiled; loading it here: {type(exc).__name__}: {exc}"[:400]))
if src != "none":
    site = Path(importlib.import_module("torch").__file__).parent.parent
    # its Python extension modules (the nanobind module; lib/libdatastates_core.so is the core library they link)
    sos = sorted(p for p in site.rglob("*.so") if p.relative_to(site).parts[0].startswith("datastates")
                 and (".cpython-" in p.name or ".abi3." in p.name))
    loaded = []
    for so in sos:  # each compiled module imported on its own: it needs CUDA's runtime, not a driver, to load
        name = ".".join(so.relative_to(site).with_suffix("").parts).split(".cpython")[0]
        try:
            importlib.import_module(name)
            loaded.append(f"{name} imported")
        except Exception as exc:  # noqa: BLE001
            loaded.append(f"{name}: {type(exc).__name__}: {exc}")
    try:
        from datastates import CheckpointEngine  # noqa: F401  what DeepSpeed 0.19.8 imports
        api = "`from datastates import CheckpointEngine` works (its constructor needs a GPU)"
        from engines import _datastates_api  # the harness's own check, on the installed package

        package = Path(importlib.import_module("datastates").__file__).parent
        try:
            found = _datastates_api.check(package)
            api += f"; {found.engine_class} has save, wait(persist), load(callable map_location)"
        except ValueError as exc:
            failed = True
            api += f"; {exc}"
    except Exception as exc:  # noqa: BLE001
        api = f"`from datastates import CheckpointEngine`: {type(exc).__name__}: {exc}"
    what = (f"compiled ({'; '.join(loaded)}); " if sos else "not built: " + first_error(log) + "; ") + api
    failed |= not sos
    parts.append(("DataStates-LLM", what))
for name, what in parts:
    print(f"{name:<26} {what}")
(work / "result.json").write_text(json.dumps(dict(parts), indent=1) + "\n")
sys.exit(1 if failed else 0)
PYEOF
log "done in $(( $(date +%s) - start )) s; logs: $WORK/dest/.venv/install.log, $WORK/install.err; result: $WORK/result.json"
exit $rc
