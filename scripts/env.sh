# Sourced by submit-job.sh and run-tests.sh: puts the harness's Python in $RH_PY.
#   1. RH_PYTHON=/path/to/python        use exactly that interpreter (nothing is installed)
#   2. the active python3, if it already imports torch and deepspeed (a cluster's module or conda env)
#      unless RH_VENV=1 forces the project-local environment, or RH_VENV_DIR names one (not asked then: the
#      probe imports torch in python3, a fraction of a second on every command)
#   3. otherwise the project-local .venv: created on first use, the project installed into it (editable, with the
#      extras of pyproject.toml under the pins of requirements.txt); again whenever either file changes.
#      RH_VENV_DIR puts it elsewhere. An environment is one checkout's (its editable install points there): another
#      checkout re-points it only when told (RH_VENV_REPOINT=1), else one line says whose it is. .ci/run keeps one per
#      requirements in the user cache, shared by every clone on the machine on purpose (it sets RH_VENV_REPOINT=1:
#      each clone re-points the editable install at itself), so a fresh clone reuses the environment and DeepSpeed's
#      JIT-built ops, which are keyed on it (restart_harness/files/cache_dir.py), instead of rebuilding
RH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

rh_log() { echo "[setup] $*" >&2; }

# The checkout's bytecode, written once as pip writes an installed package's: an editable install gets none, and
# where PYTHONDONTWRITEBYTECODE is set every process would compile the harness's modules again (0.15 CPU-s a rank
# here, inside the restart's measured `imports` phase; docs/testing.md)
rh_compile_checkout() {
  (cd "$RH_ROOT" && "$1/bin/python" -m compileall -q -j 0 restart_harness engines analysis third_party configs \
     >/dev/null 2>&1) || rh_log "could not write the checkout's bytecode (Python compiles it in every process then)"
}

# RH_PYTHON must be a Python 3.10+ that can import what a run needs; asked without importing them (find_spec: a few
# hundredths of a second, on every command), so a shell, /bin/false or a bare Python is one line, not a failed run.
rh_check_python() {
  local why
  why="$("$1" -c 'import importlib.util as u, sys
if sys.version_info < (3, 10): print("Python", sys.version.split()[0], "is older than 3.10"); raise SystemExit
missing = [m for m in ("torch", "deepspeed", "yaml") if u.find_spec(m) is None]
print("it lacks " + ", ".join(missing) if missing else "ok")' 2>/dev/null)" || why=""
  [[ "$why" == ok ]] && return 0
  echo "error: RH_PYTHON=$1: ${why:-not a Python (it did not run a Python statement)}; accepted: the path of a" \
       "Python 3.10+ with torch, deepspeed and PyYAML, or leave RH_PYTHON unset (the project's .venv)" >&2
  exit 2
}

rh_choose_python() {
  if [[ -n "${RH_VENV:-}" && "$RH_VENV" != 0 && "$RH_VENV" != 1 ]]; then
    echo "error: RH_VENV=$RH_VENV: accepted: 1 (use the project's .venv), 0 or unset" >&2
    exit 2
  fi
  if [[ -n "${RH_PYTHON:-}" ]]; then
    if [[ ! -x "$RH_PYTHON" && -z "$(command -v "$RH_PYTHON" 2>/dev/null)" ]]; then
      echo "error: RH_PYTHON=$RH_PYTHON: no such executable; accepted: the path of a Python that has torch and" \
           "deepspeed, or leave RH_PYTHON unset (the project's .venv)" >&2
      exit 2
    fi
    rh_check_python "$RH_PYTHON"
    RH_PY="$RH_PYTHON"; return
  fi
  if [[ "${RH_VENV:-0}" != 1 && -z "${RH_VENV_DIR:-}" ]] && command -v python3 >/dev/null \
     && python3 -c 'import torch, deepspeed, yaml' >/dev/null 2>&1 \
     && [[ "$(command -v python3)" != "$RH_ROOT/.venv/bin/python3" ]]; then
    RH_PY="$(command -v python3)"; return
  fi
  if [[ -n "${RH_VENV_REPOINT:-}" && "$RH_VENV_REPOINT" != 0 && "$RH_VENV_REPOINT" != 1 ]]; then
    echo "error: RH_VENV_REPOINT=$RH_VENV_REPOINT: accepted: 1 (re-point RH_VENV_DIR's environment at this checkout)," \
         "0 or unset" >&2
    exit 2
  fi
  local venv="${RH_VENV_DIR:-$RH_ROOT/.venv}" stamp owner
  owner="$(cat "$venv/.project-root" 2>/dev/null || true)"
  # (the checkout's own .venv, moved with its checkout, is re-pointed without asking: it is no other's)
  if [[ -n "${RH_VENV_DIR:-}" && -n "$owner" && "$owner" != "$RH_ROOT" && "${RH_VENV_REPOINT:-0}" != 1 ]]; then
    echo "error: RH_VENV_DIR=$venv: the environment of the checkout $owner (its editable install points there);" \
         "accepted: RH_VENV_REPOINT=1 to re-point it at this checkout ($RH_ROOT; $owner then needs the same to take" \
         "it back), another RH_VENV_DIR, or leave RH_VENV_DIR unset (this checkout's own .venv)" >&2
    exit 2
  fi
  stamp="$venv/.installed-$(cat "$RH_ROOT/requirements.txt" "$RH_ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
  if [[ ! -f "$stamp" ]]; then
    if ! mkdir -p "$venv" 2>/dev/null || [[ ! -w "$venv" ]]; then
      echo "error: RH_VENV_DIR=$venv: cannot be created or written; accepted: a writable folder for the" \
           "project's environment, or leave RH_VENV_DIR unset (the checkout's .venv)" >&2
      exit 2
    fi
    rh_log "creating the project environment in $venv (first use; a few minutes)"
    python3 -m venv "$venv" || { rh_log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
    local log="$venv/install.log"
    rh_log "installing torch (pinned CPU build); pip's output goes to $log"
    { "$venv/bin/python" -m pip install -q --upgrade pip \
      && "$venv/bin/python" -m pip install -q "$(grep -E '^torch==' "$RH_ROOT/requirements.txt")"; } >"$log" 2>&1 \
      || { cat "$log" >&2; exit 1; }
    rh_log "installing the project with its extras (run, analysis, trace, s3, attribution, test) under requirements.txt's pins"
    DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q -c "$RH_ROOT/requirements.txt" \
      -e "$RH_ROOT[run,analysis,trace,s3,attribution,test]" >>"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    rm -f "$venv"/.installed-* && touch "$stamp"
    echo "$RH_ROOT" > "$venv/.project-root"
    rh_compile_checkout "$venv"
  fi
  if [[ "$(cat "$venv/.project-root" 2>/dev/null)" != "$RH_ROOT" ]]; then  # shared by checkouts: RH_VENV_REPOINT=1
    rh_log "pointing $venv at this checkout ($RH_ROOT; it was ${owner:-no checkout}'s: RH_VENV_REPOINT=1)"
    # with the environment's own setuptools when it has one (3 s; a build environment of pip's own takes 10 s,
    # every fresh clone CI makes)
    { DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$RH_ROOT" \
      || DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --no-deps -e "$RH_ROOT"; } >>"$venv/install.log" 2>&1 \
      || { cat "$venv/install.log" >&2; exit 1; }
    echo "$RH_ROOT" > "$venv/.project-root"
    rh_compile_checkout "$venv"
  fi
  RH_PY="$venv/bin/python"
}

rh_choose_python
export RH_PY
