#!/usr/bin/env bash
# Build DataStates-LLM from its sources (the CMake + nanobind layout of scripts/bundle/datastates-llm.pin) against this
# node's CUDA and torch, and install it into PYTHON's environment: its C++/CUDA core and nanobind module with CMake
# into site-packages/datastates, then the Python package llm/ with pip (no index, no build isolation, no
# dependencies: fasteners and numpy, which its engines import, come from the bundle). No network.
#
#   scripts/bundle/build-datastates.sh SRC PYTHON [--liburing PREFIX] [--arch LIST] [--jobs N] [--build DIR]
#
#   SRC         a DataStates-LLM source tree (CMakeLists.txt and llm/ at its top)
#   PYTHON      the Python whose environment gets it (its torch and nanobind are built against)
#   --liburing  a folder with include/liburing.h and lib/<arch>/liburing.a (Debian's liburing-dev extracted): the
#               core links it statically; default: the system's (liburing-dev)
#   --arch      the GPUs to compile for, as TORCH_CUDA_ARCH_LIST writes them ("8.0;9.0"); default: the GPUs torch
#               sees here, else TORCH_CUDA_ARCH_LIST, else 8.0 and 9.0 (A100, H100/H200)
#   --jobs      parallel compile jobs (default: the CPUs)
#   --build     the build folder (default: SRC/build)
# Exit 0 when `from datastates import CheckpointEngine` works in PYTHON afterwards; 3 with one line when a
# prerequisite is missing (liburing, nanobind, nvcc), 1 when the build failed (its output is on stdout).
#
# The sources' python/CMakeLists.txt also declares an ALL target that runs `pip install --upgrade nanobind fasteners`
# and `pip install .` from the network: only the library and the module targets are built, never that one.
set -euo pipefail
missing() { echo "DataStates-LLM not built: $*" >&2; exit 3; }
[[ $# -ge 2 ]] || { echo "usage: scripts/bundle/build-datastates.sh SRC PYTHON [--liburing PREFIX] [--arch LIST] [--jobs N] [--build DIR]" >&2; exit 2; }
SRC="$(cd "$1" && pwd)"; PY="$2"; shift 2
URING="" ARCH="" JOBS="$(nproc)" BUILD=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --liburing) URING="${2:?}"; shift 2 ;;
    --arch) ARCH="${2:?}"; shift 2 ;;
    --jobs) JOBS="${2:?}"; shift 2 ;;
    --build) BUILD="${2:?}"; shift 2 ;;
    *) echo "unknown option $1; accepted: --liburing PREFIX, --arch LIST, --jobs N, --build DIR" >&2; exit 2 ;;
  esac
done
[[ -f "$SRC/CMakeLists.txt" && -d "$SRC/llm" ]] || missing "$SRC has no CMakeLists.txt and llm/ (not the pinned layout)"
BUILD="${BUILD:-$SRC/build}"

# liburing (io_uring, the core's writer): the carried files, else the system's
uring_flags=()
if [[ -n "$URING" ]]; then
  lib="$(find "$URING" -name 'liburing.a' | head -1)"
  [[ -f "$URING/include/liburing.h" && -n "$lib" ]] || missing "--liburing $URING has no include/liburing.h and liburing.a"
  uring_flags=(-DLIBURING_ROOT="$URING" -DLIBURING_INCLUDE_DIR="$URING/include" -DLIBURING_LIBRARY="$lib")
elif ! echo '#include <liburing.h>' | cc -E - >/dev/null 2>&1; then
  missing "liburing's headers are missing (Debian: liburing-dev; or --liburing with its files extracted)"
fi
NVCC="$(command -v nvcc || true)"
[[ -n "$NVCC" ]] || missing "nvcc (CUDA's compiler) is not on PATH"
NB_DIR="$("$PY" -m nanobind --cmake_dir 2>/dev/null)" || missing "nanobind is not importable by $PY"
# CMAKE_CUDA_ARCHITECTURES: "9.0" -> 90; an arch-specific "9.0a" -> 90a
if [[ -z "$ARCH" ]]; then
  ARCH="$("$PY" -c 'import torch
print(";".join(sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))' \
    2>/dev/null || true)"
  ARCH="${ARCH:-${TORCH_CUDA_ARCH_LIST:-8.0;9.0}}"
fi
CUDA_ARCHS="$(echo "$ARCH" | tr ' ,' ';;' | sed -E 's/\+PTX//g; s/([0-9]+)\.([0-9]+)/\1\2/g')"
PURELIB="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "[build-datastates] $SRC -> $PURELIB; nvcc $NVCC; CUDA architectures $CUDA_ARCHS; liburing ${URING:-system}"

gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
rm -rf "$BUILD"
cmake -S "$SRC" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PURELIB" \
  -DBUILD_PYTHON_BINDINGS=ON -DPython_EXECUTABLE="$PY" -Dnanobind_DIR="$NB_DIR" -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" "${uring_flags[@]}" \
  -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON
if [[ -f "$SRC/python/CMakeLists.txt" ]]; then  # 1b84990's layout: the core library and the module, nothing else
  cmake --build "$BUILD" -j"$JOBS" --target datastates_core datastates_core_py
else
  cmake --build "$BUILD" -j"$JOBS"
fi
cmake --install "$BUILD"
"$PY" -m pip install --no-index --no-deps --no-build-isolation "$SRC/llm"
"$PY" -c 'from datastates import CheckpointEngine; import datastates; print("[build-datastates] from datastates import CheckpointEngine:", datastates.__file__)'
