#!/usr/bin/env bash
# A Slurm cluster of N nodes on this machine, to try multi-node runs without a cluster (root; Debian packages in
# scripts/apt/slurm.txt). Each node is a network namespace with its own hostname, address and slurmd; this host is
# the login node (testbeds/slurm_cluster.py, docs/clusters.md).
#
#   eval "$(scripts/local-cluster.sh up 2)"     start node1, node2 in /tmp/restart-harness-cluster, export SLURM_CONF
#   eval "$(scripts/local-cluster.sh up 2 gpus=4)"   ... each with 4 stand-in GPUs (generic resources, no driver)
#   ./submit-job.sh tiny tp=2 dp=2 nodes=2 ranks_per_node=2 launcher=slurm
#   scripts/local-cluster.sh status             each node's Slurm state, address and processes
#   scripts/local-cluster.sh kill-node node2    every process of node2, its slurmd too (a lost node)
#   scripts/local-cluster.sh down               stop everything, remove namespaces, bridge and folder
#
# RH_CLUSTER_DIR picks another folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh" >&2
dir="${RH_CLUSTER_DIR:-/tmp/restart-harness-cluster}"
dir="$(realpath -m "$dir")"
cd "$RH_ROOT"  # python -m finds testbeds/ (test servers, not part of the installed harness) in the checkout
case "${1:-}" in
  up) exec "$RH_PY" -m testbeds.slurm_cluster up "${2:-}" "${@:3}" --root "$dir" ;;
  kill-node) exec "$RH_PY" -m testbeds.slurm_cluster "$1" "${2:-}" --root "$dir" ;;
  down|status) exec "$RH_PY" -m testbeds.slurm_cluster "$1" --root "$dir" ;;
  *) echo "usage: $0 up N [gpus=G] | status | kill-node NODE | down" >&2; exit 2 ;;
esac
