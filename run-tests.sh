#!/usr/bin/env bash
# ./run-tests.sh [quick] [pytest args]
#   (no tier)  every test, the slow ones included (real multi-process launches on CPU; 17-21 minutes on 2 cores)
#   quick      a change's first check: every fast test and the spine's real launch (tests/test_spine.py)
# Tests run on RH_TEST_WORKERS pytest-xdist workers (default 2; 0: in this process, one after another); a group of
# tests sharing a server, a cluster or a case of the run table stays on one worker (--dist loadgroup, xdist_group
# marks set in tests/conftest.py).
# As root on Debian it first installs the system packages the tests use (scripts/apt/*.txt); elsewhere tests needing
# a missing tool are skipped, naming it (with CI=true they fail instead). Where the time went, set-up steps included,
# is written to test-logs/durations.json (summary: python3 scripts/test_durations.py; docs/testing.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workers="${RH_TEST_WORKERS:-2}"
if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "RH_TEST_WORKERS=$workers: not a number of workers; accepted: 0 (no workers) or a count such as 2" >&2
  exit 2
fi
tier=()
if [[ "${1:-}" == quick ]]; then
  shift
  tier=(-m "not slow or spine")
fi
mkdir -p "$here/test-logs"
export RH_SETUP_TIMES="$here/test-logs/setup-steps.txt"
: > "$RH_SETUP_TIMES"
step_start=$(date +%s.%N)
step_done() { echo "$1 $(awk -v a="$step_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')" >> "$RH_SETUP_TIMES"
              step_start=$(date +%s.%N); }
"$here/scripts/install-system-packages.sh"
step_done system_packages
source "$here/scripts/env.sh"
step_done python_environment
cd "$RH_ROOT"
spread=()
if (( workers > 0 )); then spread=(-n "$workers" --dist loadgroup --no-loadscope-reorder); fi  # the order: conftest.in_schedule_order
exec "$RH_PY" -m pytest "${spread[@]}" "${tier[@]}" "$@"
