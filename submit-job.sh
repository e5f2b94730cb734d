#!/usr/bin/env bash
# ./submit-job.sh MODEL [key=value ...]   e.g. ./submit-job.sh tiny dp=2 engine=default
# Trains with DeepSpeed, checkpoints, restarts in fresh processes, verifies, and prints the run directory.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/scripts/env.sh"
exec "$RH_PY" "$RH_ROOT/config-n-run.py" "$@"
