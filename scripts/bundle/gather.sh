#!/usr/bin/env bash
# Gather, on a machine with internet, everything a compute node without internet needs to run the harness
# (docs/clusters.md#offline-install). Run it with the same Python minor version and CPU architecture as the nodes.
#
#   scripts/bundle/gather.sh OUT_DIR [--torch-index URL] [--torch-version V] [--datastates GIT_URL|DIR|TARBALL|none]
#                                    [--datastates-commit SHA] [--any-datastates-api]
#
#   --torch-index   where the node's torch build comes from, e.g. https://download.pytorch.org/whl/cu126
#                   (default: pip's own configuration: PyPI's default build, or a local wheel pip is set up to find)
#   --torch-version the torch release to carry instead of requirements.txt's pin (the CUDA build a node's driver
#                   takes; install.sh installs the one the bundle carries)
#   --datastates    DataStates-LLM sources to carry (default: the repository in scripts/bundle/datastates-llm.pin): a
#                   git URL (fetched at the pinned commit), a source folder, or a .tar.gz of one (one top folder), as
#                   where the repository cannot be cloned the pinned tree is brought as a tarball; `none` leaves it
#                   out (engine=datastates is then refused on the node, with the reason)
#   --datastates-commit  the commit of GIT_URL to carry (default: the pinned one, datastates-llm.pin)
#   --any-datastates-api carry the sources whatever API they provide (to compile them: check-cuda-build.sh); the
#                   node then refuses engine=datastates if DeepSpeed's import fails
# Sources that do not provide the API DeepSpeed 0.19.8 imports are refused before anything is gathered
# (scripts/bundle/check-datastates.py); a repository that cannot be reached leaves DataStates out, with the reason.
#
# OUT_DIR gets: constraints.txt (requirements.txt's pins, torch's as asked), wheels/ (torch at that pin, every dependency of the extras run, analysis and trace,
# build tools for DeepSpeed's ops and DataStates-LLM), src/ (DeepSpeed's source distribution, DataStates-LLM's
# sources), debs/ (Debian's liburing and libaio packages, where apt-get can download them: DataStates-LLM's core links
# liburing statically, DeepSpeed's async_io op builds against libaio), project.tar.gz (this checkout, git archive of
# HEAD), MANIFEST.sha256. Install with scripts/bundle/install.sh OUT_DIR DEST on the node.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
die() { echo "error: $*" >&2; exit 2; }
USAGE="usage: scripts/bundle/gather.sh OUT_DIR [--torch-index URL] [--torch-version V] [--datastates GIT_URL|DIR|TARBALL|none] [--datastates-commit SHA] [--any-datastates-api]"
[[ $# -ge 1 ]] || die "$USAGE"
OUT="$1"; shift
# shellcheck source=datastates-llm.pin
source "$ROOT/scripts/bundle/datastates-llm.pin"
TORCH_INDEX="" TORCH_VERSION="" DATASTATES="$DATASTATES_URL" ANY_API=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --torch-index) TORCH_INDEX="${2:?}"; shift 2 ;;
    --torch-version) TORCH_VERSION="${2:?}"; shift 2 ;;
    --datastates) DATASTATES="${2:?}"; shift 2 ;;
    --datastates-commit) DATASTATES_COMMIT="${2:?}"; shift 2 ;;
    --any-datastates-api) ANY_API=1; shift ;;
    *) die "unknown option $1; accepted: --torch-index URL, --torch-version V, --datastates GIT_URL|DIR|TARBALL|none, --datastates-commit SHA, --any-datastates-api" ;;
  esac
done
[[ -z "$TORCH_VERSION" || "$TORCH_VERSION" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] \
  || die "--torch-version $TORCH_VERSION; accepted: a release number such as 2.13.0"
[[ -e "$OUT" && -n "$(ls -A "$OUT" 2>/dev/null)" ]] && die "$OUT exists and is not empty"
PY="${PYTHON:-python3}"
log() { echo "[bundle] $*" >&2; }

# DataStates-LLM first: sources without the API DeepSpeed imports are refused before anything is written
DS_TMP="$(mktemp -d)"; trap 'rm -rf "$DS_TMP"' EXIT
DS_MISSING="" DS_FROM=""
case "$DATASTATES" in
  none) DS_MISSING="not gathered (--datastates none)" ;;
  *)
    if [[ -d "$DATASTATES" ]]; then
      cp -a "$DATASTATES" "$DS_TMP/datastates-llm"; rm -rf "$DS_TMP/datastates-llm/.git"; DS_FROM="$DATASTATES"
    elif [[ -f "$DATASTATES" ]]; then  # a tarball of the sources: its one top folder is the tree
      mkdir "$DS_TMP/unpacked"
      tar -C "$DS_TMP/unpacked" -xzf "$DATASTATES" 2>/dev/null \
        || die "--datastates $DATASTATES: not a .tar.gz; accepted: a git URL, a source folder, a .tar.gz of one, or none"
      top=("$DS_TMP"/unpacked/*)
      [[ ${#top[@]} -eq 1 && -d "${top[0]}" ]] \
        || die "--datastates $DATASTATES: holds ${#top[@]} entries at its top; accepted: a .tar.gz of one source folder"
      mv "${top[0]}" "$DS_TMP/datastates-llm"; rm -rf "$DS_TMP/datastates-llm/.git"
      DS_FROM="$DATASTATES (sha256 $(sha256sum "$DATASTATES" | cut -c1-16))"
    else
      log "DataStates-LLM sources: $DATASTATES at $DATASTATES_COMMIT"
      if git init -q "$DS_TMP/datastates-llm" \
         && git -C "$DS_TMP/datastates-llm" fetch -q --depth 1 "$DATASTATES" "$DATASTATES_COMMIT" 2>"$DS_TMP/err" \
         && git -C "$DS_TMP/datastates-llm" checkout -q FETCH_HEAD 2>>"$DS_TMP/err"; then
        rm -rf "$DS_TMP/datastates-llm/.git"; DS_FROM="$DATASTATES@$DATASTATES_COMMIT"
      else
        DS_MISSING="fetch of $DATASTATES at $DATASTATES_COMMIT failed: $(tail -1 "$DS_TMP/err")"
        log "$DS_MISSING: engine=datastates will be refused on the node"
      fi
    fi
    if [[ -n "$DS_FROM" && "$ANY_API" == 0 ]]; then
      why="$("$PY" "$ROOT/scripts/bundle/check-datastates.py" "$DS_TMP/datastates-llm" 2>&1 >/dev/null)" \
        || die "--datastates $DS_FROM: ${why#"$DS_TMP/datastates-llm: "}"
    fi ;;
esac

mkdir -p "$OUT/wheels" "$OUT/src"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gather.log"
quiet() { "$@" >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; die "failed: $* (whole log: $LOG)"; }; }
# the constraints every download is under: requirements.txt, with the torch release asked for
CONSTRAINTS="$OUT/constraints.txt"
if [[ -n "$TORCH_VERSION" ]]; then
  sed -E "s/^torch==.*/torch==$TORCH_VERSION/" "$ROOT/requirements.txt" > "$CONSTRAINTS"
else
  cp "$ROOT/requirements.txt" "$CONSTRAINTS"
fi
pin() { grep -E "^$1==" "$CONSTRAINTS" | head -1; }

if [[ -n "$TORCH_INDEX" ]]; then  # the build from that index first (the download below would take PyPI's as well)
  log "torch ($(pin torch)) from $TORCH_INDEX"
  quiet "$PY" -m pip download -d "$OUT/wheels" --index-url "$TORCH_INDEX" "$(pin torch)"
fi

log "torch ($(pin torch)) and every dependency of the extras run, analysis and trace, under requirements.txt's pins"
# the extras' requirements, read from pyproject.toml (torch is already there; deepspeed's own dependencies come
# from its metadata)
mapfile -t REQS < <("$PY" - "$ROOT/pyproject.toml" <<'PYEOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"])
for extra in ("run", "analysis", "trace"):
    reqs += project["optional-dependencies"][extra]
import re
print("\n".join(r for r in reqs if not re.match(r"torch\s*([<>=!~;]|$)", r)))
PYEOF
)
# build tools: DeepSpeed's ops (ninja), DataStates-LLM (cmake, nanobind, or pybind11 for older sources; fasteners and numpy, which its Python
# engine imports), the project itself (setuptools); nvidia-ml-py, which DeepSpeed 0.19.8 requires when it is built for
# CUDA (DS_ACCELERATOR=cuda; its requirements as read here, on a machine without CUDA, leave it out: found by
# scripts/bundle/check-cuda-build.sh)
# DeepSpeed as its source distribution (built on the node, with the ops its CUDA allows), in the same resolution:
# pip prepares an sdist's metadata in a build environment of its own (about 9 CPU-seconds), once
quiet "$PY" -m pip download -d "$OUT/wheels" -c "$CONSTRAINTS" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} \
  --no-binary deepspeed "$(pin deepspeed)" \
  "${REQS[@]}" "$(pin torch)" setuptools wheel ninja packaging cmake nanobind pybind11 fasteners numpy pip nvidia-ml-py
mv "$OUT"/wheels/deepspeed-*.tar.gz "$OUT/src/"
log "DeepSpeed source distribution: $(basename "$OUT"/src/deepspeed-*.tar.gz)"

# Debian's packages of the two system libraries a node may lack (carried as files; install.sh extracts them)
mkdir -p "$OUT/debs"
if command -v apt-get >/dev/null && (cd "$OUT/debs" && apt-get download -q liburing2 liburing-dev libaio1 libaio-dev) \
     >>"$LOG" 2>&1; then
  log "Debian packages: $(cd "$OUT/debs" && echo *.deb)"
else
  log "liburing and libaio packages not carried (apt-get download failed, see $LOG): a node without liburing-dev does not build DataStates-LLM"
fi

if [[ -n "$DS_FROM" ]]; then
  log "DataStates-LLM sources ($DS_FROM)"
  tar -C "$DS_TMP" -czf "$OUT/src/datastates-llm.tar.gz" datastates-llm
  echo "$DS_FROM" > "$OUT/src/datastates-llm.source"
else
  echo "$DS_MISSING" > "$OUT/src/datastates-llm.MISSING"
fi

log "this checkout (HEAD)"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$ROOT" archive --format=tar.gz -o "$OUT/project.tar.gz" HEAD
  git -C "$ROOT" rev-parse HEAD > "$OUT/project.commit"
else
  tar -C "$ROOT" --exclude=.venv --exclude=results --exclude=reports -czf "$OUT/project.tar.gz" .
fi

(cd "$OUT" && find . -type f ! -name MANIFEST.sha256 ! -name gather.log -print0 | sort -z | xargs -0 sha256sum > MANIFEST.sha256)
log "$(wc -l < "$OUT/MANIFEST.sha256") files, $(du -sh "$OUT" | cut -f1) in $OUT; on the node: scripts/bundle/install.sh $OUT DEST"
