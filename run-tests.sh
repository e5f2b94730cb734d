#!/usr/bin/env bash
# ./run-tests.sh [pytest args]   All tests, slow ones included (real DeepSpeed launches on CPU).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/scripts/env.sh"
cd "$RH_ROOT"
exec "$RH_PY" -m pytest "$@"
