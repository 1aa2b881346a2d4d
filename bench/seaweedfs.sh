#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (a distributed file system users pick instead
# of parcache: master, volume server and filer, mounted with FUSE) into
# target/rivals/weed, once, from the Go module proxy, and prints its path.
# `bench/speed.sh` measures it beside parcache with the same jobs
# (mount-io's PARCACHE_RIVAL_WEED). Needs a Go toolchain as new as the
# release's go.mod asks (1.26); without one, or if the proxy refuses the
# release, it says why on stderr and exits 1, and speed.sh goes on without
# the rival.
# Usage: bench/seaweedfs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# The release the module proxy serves here (a pseudo-version of the
# repository's master, 2026-11-09).
version=v0.0.0-20261109003541-7506e5f91cd6
out=target/rivals/weed
if [ -x "$out" ] && [ "$(cat target/rivals/weed.version 2>/dev/null)" = "$version" ]; then
  echo "$PWD/$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  [ -x /usr/local/go/bin/go ] && PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "bench/seaweedfs.sh: no Go toolchain (go 1.26 or later), so SeaweedFS is not built and not measured" >&2
  exit 1
fi
echo "bench/seaweedfs.sh: building SeaweedFS $version with $(go version | awk '{print $3}') (once; a few minutes)" >&2
# `go install` refuses a module whose go.mod has replace directives, so the
# module's source is fetched and built as the main module.
json=$(go mod download -json "github.com/seaweedfs/seaweedfs@$version") || {
  echo "bench/seaweedfs.sh: the Go module proxy did not serve SeaweedFS $version; not measured" >&2
  exit 1
}
src=$(printf '%s' "$json" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
work=target/rivals/seaweedfs-src
rm -rf "$work"
mkdir -p target/rivals
cp -r "$src" "$work"
chmod -R u+w "$work"
if ! (cd "$work" && go build -o "../weed" ./weed) >&2; then
  echo "bench/seaweedfs.sh: building SeaweedFS failed (above); not measured" >&2
  exit 1
fi
rm -rf "$work"
echo "$version" > target/rivals/weed.version
echo "$PWD/$out"
