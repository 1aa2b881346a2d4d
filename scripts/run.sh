#!/usr/bin/env bash
# The main job: build parcache, reproduce every published number it models
# (tables, JSON and SVG plots into results/), then bring up a parcache
# cluster on this host, mounted for any program:
#   data and servers under run/cluster, the mount at run/mnt.
# Stop it with `target/release/parcache down --data run/cluster`.
# PARCACHE_NO_MOUNT=1 skips the cluster (e.g. where /dev/fuse is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release
target/release/parcache sim run all --out "${1:-results}"

if [ "${PARCACHE_NO_MOUNT:-0}" = 1 ]; then
  exit 0
fi
pc=target/release/parcache
mkdir -p run/mnt
# `up` restarts a stopped cluster from its data, and refuses a running one.
if ! out=$($pc up --data run/cluster --mount run/mnt 2>&1); then
  if grep -q "already running" <<<"$out"; then
    echo "run: a parcache cluster is already running in run/cluster"
  else
    echo "$out" >&2
    exit 1
  fi
else
  echo "$out"
fi
echo "run: try  cp -r crates run/mnt/ && ls run/mnt && $pc policy get --data run/cluster pc:/crates"
echo "run: stop with  $pc down --data run/cluster"
