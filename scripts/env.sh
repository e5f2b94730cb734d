# Sourced by submit-job.sh and run-tests.sh: puts the harness's Python in $RH_PY.
#   1. RH_PYTHON=/path/to/python        use exactly that interpreter (nothing is installed)
#   2. the active python3, if it already imports torch and deepspeed (a cluster's module or conda env)
#      unless RH_VENV=1 forces the project-local environment
#   3. otherwise the project-local .venv, created and filled from requirements.txt on first use
#      (again whenever requirements.txt changes)
RH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

rh_log() { echo "[setup] $*" >&2; }

rh_choose_python() {
  if [[ -n "${RH_PYTHON:-}" ]]; then
    RH_PY="$RH_PYTHON"; return
  fi
  if [[ "${RH_VENV:-0}" != 1 ]] && command -v python3 >/dev/null \
     && python3 -c 'import torch, deepspeed, yaml' >/dev/null 2>&1 \
     && [[ "$(command -v python3)" != "$RH_ROOT/.venv/bin/python3" ]]; then
    RH_PY="$(command -v python3)"; return
  fi
  local venv="$RH_ROOT/.venv" stamp
  stamp="$venv/.installed-$(sha256sum "$RH_ROOT/requirements.txt" | cut -c1-16)"
  if [[ ! -f "$stamp" ]]; then
    rh_log "creating the project environment in $venv (first use; a few minutes)"
    python3 -m venv "$venv" || { rh_log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    rh_log "installing torch (pinned CPU build)"
    "$venv/bin/python" -m pip install -q "$(grep -E '^torch==' "$RH_ROOT/requirements.txt")" >&2 || exit 1
    rh_log "installing deepspeed and the rest of requirements.txt"
    DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q -r "$RH_ROOT/requirements.txt" >&2 || exit 1
    rm -f "$venv"/.installed-* && touch "$stamp"
  fi
  RH_PY="$venv/bin/python"
}

rh_choose_python
export RH_PY
