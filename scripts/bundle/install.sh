#!/usr/bin/env bash
# Install, on a node without internet, the harness from a bundle made by scripts/bundle/gather.sh: nothing is
# downloaded (pip runs with --no-index, the bundle's wheels only, this machine's pip configuration ignored).
#
#   scripts/bundle/install.sh BUNDLE DEST [--cuda auto|yes|no] [--deepspeed-ops auto|none]
#
#   --deepspeed-ops none  DeepSpeed with no prebuilt op, on CUDA too (they JIT-build on first use): what
#                   check-cuda-build.sh --datastates-only uses to compile DataStates-LLM alone
#
# DEST gets the project (from the bundle's project.tar.gz) and DEST/.venv with torch, DeepSpeed (built from source:
# with its async_io op on CUDA when libaio's headers are there, which FastPersist needs; no ops otherwise, they
# JIT-build on first use), the extras run, analysis and trace, and, on CUDA, DataStates-LLM built against the node's
# CUDA and torch. DEST/submit-job.sh then uses that environment as is.
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
log() { echo "[install] $*" >&2; }
[[ $# -ge 2 ]] || die "usage: scripts/bundle/install.sh BUNDLE DEST [--cuda auto|yes|no] [--deepspeed-ops auto|none]"
BUNDLE="$(cd "$1" && pwd)" || die "$1: no such bundle directory"; DEST="$2"; shift 2
CUDA=auto DS_OPS=auto
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cuda) CUDA="${2:?}"; shift 2 ;;
    --deepspeed-ops) DS_OPS="${2:?}"; shift 2 ;;
    *) die "unknown option $1; accepted: --cuda auto|yes|no, --deepspeed-ops auto|none" ;;
  esac
done
[[ "$CUDA" =~ ^(auto|yes|no)$ ]] || die "--cuda $CUDA; accepted: auto, yes, no"
[[ "$DS_OPS" =~ ^(auto|none)$ ]] || die "--deepspeed-ops $DS_OPS; accepted: auto, none"
[[ -f "$BUNDLE/MANIFEST.sha256" ]] || die "$BUNDLE: no MANIFEST.sha256 (not a bundle of scripts/bundle/gather.sh)"
[[ -e "$DEST" && -n "$(ls -A "$DEST" 2>/dev/null)" ]] && die "$DEST exists and is not empty"

log "checking the bundle's files against MANIFEST.sha256"
(cd "$BUNDLE" && sha256sum --quiet -c MANIFEST.sha256) || die "$BUNDLE: files differ from MANIFEST.sha256"

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
tar -C "$DEST" -xzf "$BUNDLE/project.tar.gz"
PY="${PYTHON:-python3}"
"$PY" -m venv "$DEST/.venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
VPY="$DEST/.venv/bin/python"
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS="$BUNDLE/wheels" PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_EXTRA_INDEX_URL PIP_INDEX_URL
# the bundle's pins: requirements.txt's, with the torch release it carries (gather.sh --torch-version)
CONSTRAINTS="$BUNDLE/constraints.txt"
[[ -f "$CONSTRAINTS" ]] || CONSTRAINTS="$DEST/requirements.txt"
pin() { grep -E "^$1==" "$CONSTRAINTS" | head -1; }
LOG="$DEST/.venv/install.log"
run() { "$@" >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; die "failed: $* (whole log: $LOG)"; }; }

# DataStates-LLM (the bundle's pinned sources, scripts/bundle/datastates-llm.pin), built against this node's CUDA and
# torch by scripts/bundle/build-datastates.sh, with the bundle's liburing (debs/, Debian's liburing-dev: headers and
# the static library its core links) where the node has none. A failed build leaves the harness installed without it:
# engine=datastates is then refused on this node, with the reason.
build_datastates() {
  local src="$DEST/.venv/datastates-llm" uring=()
  tar -C "$DEST/.venv" -xzf "$BUNDLE/src/datastates-llm.tar.gz"
  log "DataStates-LLM ($(cat "$BUNDLE/src/datastates-llm.source" 2>/dev/null)), built against this node's CUDA and torch"
  if ! echo '#include <liburing.h>' | cc -E - >/dev/null 2>&1 && ls "$BUNDLE"/debs/liburing-dev_*.deb >/dev/null 2>&1; then
    extract_deb "$BUNDLE"/debs/liburing-dev_*.deb "$DEST/.venv/liburing"
    uring=(--liburing "$DEST/.venv/liburing/usr")
  fi
  if "$DEST/scripts/bundle/build-datastates.sh" "$src" "$VPY" "${uring[@]}" >>"$LOG" 2>&1; then
    log "DataStates-LLM installed: from datastates import CheckpointEngine works"
  else
    log "DataStates-LLM did not build or import ($(grep -h 'DataStates-LLM not built' "$LOG" | tail -1 || true); see $LOG): engine=datastates is refused on this node"
  fi
}
# A Debian package's files under DIR, without dpkg where there is none (an .deb is an ar archive holding data.tar.*)
extract_deb() {
  mkdir -p "$2"
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  local tmp; tmp="$(mktemp -d)"
  (cd "$tmp" && ar x "$1") && tar -C "$2" -xf "$tmp"/data.tar.*
  rm -rf "$tmp"
}

log "torch and build tools (log: $LOG)"
run "$VPY" -m pip install --upgrade pip
run "$VPY" -m pip install "$(pin torch)" setuptools wheel ninja packaging cmake nanobind pybind11 fasteners numpy

if [[ "$CUDA" == auto ]]; then
  CUDA=no
  if "$VPY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
     && command -v nvcc >/dev/null; then CUDA=yes; fi
fi
DS_SRC="$(ls "$BUNDLE"/src/deepspeed-*.tar.gz | head -1)"
# DeepSpeed 0.19.8's op builder cannot parse an architecture-specific entry of TORCH_CUDA_ARCH_LIST ("9.0a", which
# torch and some GPU images use): its ops are built for the plain architecture (third_party/deepspeed_arch_list.py)
if [[ -n "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
  archs="$(cd "$DEST" && "$PY" -c 'import os; from third_party.deepspeed_arch_list import plain
print(plain(os.environ["TORCH_CUDA_ARCH_LIST"]))')"
  if [[ "$archs" != "$TORCH_CUDA_ARCH_LIST" ]]; then
    log "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST: DeepSpeed 0.19.8 cannot parse it; its ops are built for $archs"
    export TORCH_CUDA_ARCH_LIST="$archs"
  fi
fi
# Where CUDA's toolkit is, for torch's extension builds: CUDA_HOME if set, else the folder nvcc runs from (nvcc may
# be a wrapper script on PATH: torch would take the wrapper's folder, /usr/local, and link without libcudart).
cuda_home() {
  local here
  here="$(nvcc -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)"
  [[ -n "$here" && -d "$here/.." ]] && (cd "$here/.." && pwd)
}
# DeepSpeed's async_io op links the driver library (-lcuda), which only a node with an NVIDIA driver has. Where there is
# none (a login node) it links against the toolkit's stub (lib64/stubs/libcuda.so), as NVIDIA intends, or, where the
# toolkit ships none, a stub made here: an empty library named like the driver's (libcuda.so.1), which the node's
# driver library replaces when the op is loaded there.
driver_stub() {
  if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\b'; then return 0; fi
  local stubs="$CUDA_HOME/lib64/stubs"
  if [[ ! -e "$stubs/libcuda.so" ]]; then
    stubs="$DEST/.venv/cuda-stubs"; mkdir -p "$stubs"
    echo '' | cc -x c -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stubs/libcuda.so" - 2>>"$LOG"
  fi
  export LIBRARY_PATH="$stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
  log "no NVIDIA driver library here: linking against a stub of it ($stubs/libcuda.so); the node's driver is loaded there"
}
# torch's CUDA headers include CUDA's math libraries' (cusparse.h, cublas_v2.h); a toolkit installed without them (a
# compiler-only install) takes them from the NVIDIA wheels torch brought (site-packages/nvidia/*/include), searched
# after the toolkit's own.
math_headers() {
  [[ -e "$CUDA_HOME/include/cusparse.h" ]] && return 0
  local dirs
  dirs="$("$VPY" -c 'import glob, os, sysconfig; print(":".join(sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "include")))))')"
  [[ -n "$dirs" ]] || return 0
  export CPATH="${CPATH:+$CPATH:}$dirs"
  log "CUDA's math-library headers are not in $CUDA_HOME/include: using those of torch's NVIDIA wheels ($dirs)"
}
if [[ "$CUDA" == yes ]]; then
  export CUDA_HOME="${CUDA_HOME:-$(cuda_home)}"
  [[ -n "$CUDA_HOME" ]] || die "--cuda yes: nvcc not found (CUDA's compiler builds DeepSpeed's ops and DataStates-LLM)"
  log "CUDA toolkit $CUDA_HOME"
  driver_stub
  math_headers
  # built for the CUDA accelerator even where no GPU answers (a login node): DS_ACCELERATOR=cuda, the GPUs from
  # TORCH_CUDA_ARCH_LIST (set it there: nothing to ask)
  if [[ "$DS_OPS" == none ]]; then
    log "DeepSpeed from source, no prebuilt ops (--deepspeed-ops none: they JIT-build on first use)"
    run env DS_ACCELERATOR=cuda DS_BUILD_OPS=0 "$VPY" -m pip install --no-build-isolation "$DS_SRC"
  elif echo '#include <libaio.h>' | cc -E - >/dev/null 2>&1; then
    # async_io resolves its pinned-memory manager from the pin_memory op, which DeepSpeed loads first: built with it
    log "DeepSpeed from source with its async_io and pin_memory (FastPersist) and fused_adam ops (several minutes)"
    run env DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_AIO=1 DS_BUILD_PIN_MEMORY=1 DS_BUILD_FUSED_ADAM=1 \
      "$VPY" -m pip install --no-build-isolation "$DS_SRC"
  else
    log "libaio headers missing (Debian: libaio-dev): DeepSpeed with fused_adam only; engine=fastpersist JIT-builds"
    run env DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_FUSED_ADAM=1 "$VPY" -m pip install --no-build-isolation "$DS_SRC"
  fi
else
  log "DeepSpeed from source, no prebuilt ops (CPU node: ops JIT-build on first use)"
  run env DS_BUILD_OPS=0 "$VPY" -m pip install --no-build-isolation "$DS_SRC"
fi

log "the project with its extras run, analysis and trace, under requirements.txt's pins"
run "$VPY" -m pip install --no-build-isolation -c "$CONSTRAINTS" -e "$DEST[run,analysis,trace]"

if [[ -f "$BUNDLE/src/datastates-llm.tar.gz" && "$CUDA" == yes ]]; then
  build_datastates
elif [[ -f "$BUNDLE/src/datastates-llm.tar.gz" ]]; then
  log "DataStates-LLM not built: it needs CUDA (engine=datastates is refused on this node, with the reason)"
else
  log "DataStates-LLM not in the bundle ($(cat "$BUNDLE"/src/datastates-llm.MISSING 2>/dev/null))"
fi

# what scripts/env.sh looks for: this environment is complete, use it as is
touch "$DEST/.venv/.installed-$(cat "$DEST/requirements.txt" "$DEST/pyproject.toml" | sha256sum | cut -c1-16)"
(cd "$DEST" && pwd) > "$DEST/.venv/.project-root"  # the checkout its editable install points at
"$VPY" -c 'import torch, deepspeed, restart_harness; print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, cuda {torch.cuda.is_available()}")' >&2
log "done: $DEST/submit-job.sh tiny   (GPU check matrix: $DEST/submit-job.sh matrix)"
