#!/usr/bin/env bash
# Every ratio issue 14 (speed) asks for, in one command: the mount against
# a local directory, bindfs and loopback TCP, with IOR's and mdtest's
# patterns (mount-io), then the client library against loopback TCP and
# memcpy (cluster-io). Run as root, so "cold" is cold (drop_caches).
# Usage: bench/speed.sh [MIB [FILES]]   (defaults 1024 and 10000)
# The mount takes its requests over /dev/fuse, as `parcache mount` does by
# default; PARCACHE_FUSE_URING=on puts it on FUSE's io_uring queues
# (`mount --io-uring`; the run sets enable_uring for parcache's part and
# puts it back).
# SeaweedFS, a distributed file system users pick instead, runs the same
# jobs beside parcache where bench/seaweedfs.sh can build it (a Go
# toolchain and the Go module proxy); PARCACHE_RIVALS=off leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-1024}
files=${2:-10000}
scripts/setup.sh
echo "bench/speed.sh: building the benchmarks (release)" >&2
cargo build --release --locked -p parcache-bench --bin mount-io --bin cluster-io
rival=no
if [ "${PARCACHE_RIVALS:-on}" != off ] && weed=$(bench/seaweedfs.sh); then
  export PARCACHE_RIVAL_WEED="$weed"
  rival=yes
else
  unset PARCACHE_RIVAL_WEED
  echo "bench/speed.sh: SeaweedFS is not measured in this run" >&2
fi
echo "== the mount (mount-io $mib $files; PARCACHE_FUSE_URING=${PARCACHE_FUSE_URING:-off}; SeaweedFS beside it: $rival)"
target/release/mount-io "$mib" "$files"
echo "== the client library (cluster-io $mib)"
target/release/cluster-io "$mib"
