#!/usr/bin/env bash
# Installs what parcache needs beyond the Rust toolchain on a Debian machine.
# Idempotent: installs only what is missing. Called by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install the Rust toolchain (https://rustup.rs) first" >&2
  exit 1
fi

# Debian packages the project needs, one per line (comments allowed).
mapfile -t wanted < <(grep -v '^\s*#' scripts/apt-packages.txt | awk 'NF {print $1}')
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q "${missing[@]}"
fi

# pjdfstest, the public POSIX conformance suite the mount is tested with
# (crates/cli/tests/mount.rs), built from crates.io into target/tools.
if [ ! -x target/tools/bin/pjdfstest ]; then
  echo "setup: building pjdfstest 0.2.2 (once) into target/tools"
  cargo install --quiet --locked pjdfstest --version 0.2.2 --root target/tools
fi
