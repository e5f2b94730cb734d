#!/usr/bin/env bash
# Installs the Debian packages the tests use (scripts/apt/*.txt: fio, chromium, slurm, munge, ...) when run as root
# on a machine with apt-get; otherwise says which are missing and returns 0: the tests that need them are skipped,
# each naming its tool (under CI=true they fail instead). RH_NO_APT=1 skips the installation.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
shopt -s nullglob
lists=(scripts/apt/*.txt)
(( ${#lists[@]} )) || exit 0
pkgs=$(sed 's/#.*//' "${lists[@]}" | xargs -r echo)
[[ -n "$pkgs" ]] || exit 0
command -v dpkg >/dev/null || { echo "[setup] no dpkg: not a Debian system; tests needing $pkgs may be skipped" >&2; exit 0; }
missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | xargs -r echo)
[[ -n "$missing" ]] || exit 0
if [[ "${RH_NO_APT:-0}" == 1 || $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "[setup] not installing system packages ($missing): tests that need them will be skipped" >&2
  exit 0
fi
echo "[setup] installing system packages the tests use: $missing" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
