#!/usr/bin/env bash
# A local S3 server to try ckpt_dir=s3://... without a cloud account: a single-node Ceph RADOS Gateway whose objects
# live in memory (testbeds/ceph_s3.py; Debian packages in scripts/apt/s3.txt).
#
#   eval "$(scripts/local-s3.sh start)"        start it in /tmp/restart-harness-s3, create bucket `ckpt`, export AWS_*
#   ./submit-job.sh tiny dp=2 ckpt_dir=s3://ckpt/runs
#   scripts/local-s3.sh stop                    stop it and delete its folder
#
# RH_S3_DIR picks another folder, RH_S3_MEMORY_MIB the object memory (default 2048).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh" >&2
dir="${RH_S3_DIR:-/tmp/restart-harness-s3}"
dir="$(realpath -m "$dir")"
cd "$RH_ROOT"  # python -m finds testbeds/ (test servers, not part of the installed harness) in the checkout
case "${1:-}" in
  start) exec "$RH_PY" -m testbeds.ceph_s3 start "$dir" --bucket ckpt \
           --memory-mib "${RH_S3_MEMORY_MIB:-2048}" ;;
  stop) exec "$RH_PY" -m testbeds.ceph_s3 stop "$dir" ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
