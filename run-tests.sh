#!/usr/bin/env bash
# ./run-tests.sh [pytest args]   All tests, slow ones included (real launches on CPU). As root on Debian it first
# installs the system packages the tests use (scripts/apt/*.txt); elsewhere tests needing a missing tool are
# skipped, naming it (with CI=true they fail instead).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/scripts/install-system-packages.sh"
source "$here/scripts/env.sh"
cd "$RH_ROOT"
exec "$RH_PY" -m pytest "$@"
