#!/usr/bin/env bash
# What an O_APPEND write costs on the mount, and whether appends from two
# nodes keep every line: a cluster with two mounts (two nodes); Python
# appending LINES 56-byte lines (one write(2) each) alone on one node, then
# four appenders at once, two on each node, under close-to-open (the
# default), posix and none (which appends at the end the node knows, as
# every plug-in did before the metadata server placed appends); ROUNDS
# rounds. Prints lines a second and the lines kept.
# Usage: bench/append.sh [LINES [ROUNDS]]   (defaults 5000 and 2)
set -euo pipefail
cd "$(dirname "$0")/.."
lines=${1:-5000}
rounds=${2:-2}
scripts/setup.sh
echo "bench/append.sh: building parcache (release)" >&2
cargo build --release --locked -p parcache-cli
p=$PWD/target/release/parcache
base=$(mktemp -d /tmp/parcache-append-bench.XXXXXX)
mkdir -p "$base/a" "$base/b"
stop() {
    fusermount3 -u "$base/b" 2>/dev/null || true
    "$p" down --data "$base/d" >/dev/null 2>&1 || true
    rm -rf "$base"
}
trap stop EXIT
"$p" up --data "$base/d" --mount "$base/a" >/dev/null
"$p" mount --data "$base/d" "$base/b" >"$base/b.log" 2>&1 &
for _ in $(seq 50); do mountpoint -q "$base/b" && break; sleep 0.1; done
mountpoint -q "$base/b" || { echo "the second mount did not come up: $(cat "$base/b.log")" >&2; exit 1; }
app() { # PATH TAG N: appends N lines, prints lines/s
    python3 - "$@" <<'EOF'
import sys, time
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.time()
with open(path, "a", buffering=1) as f:
    for i in range(n):
        f.write(f"{tag} {i:06d} " + "x" * (55 - len(tag) - 8) + "\n")
print(f"{n / (time.time() - t):.0f}")
EOF
}
for plugin in close-to-open posix none; do
    mkdir "$base/a/$plugin"
    "$p" policy set --data "$base/d" "pc:/$plugin" "consistency=$plugin" >/dev/null
done
printf '%-14s %6s %14s %28s %12s\n' plug-in round "one, lines/s" "four on two nodes, lines/s" "lines kept"
for round in $(seq "$rounds"); do
    for plugin in close-to-open posix none; do
        one=$(app "$base/a/$plugin/one" A "$lines")
        f=$plugin/four
        rates=$( (app "$base/a/$f" A "$lines" & app "$base/a/$f" B "$lines" &
                  app "$base/b/$f" C "$lines" & app "$base/b/$f" D "$lines" & wait) | sort -n | tr '\n' ' ')
        kept=$(wc -l <"$base/b/$f")
        printf '%-14s %6s %14s %28s %12s\n' "$plugin" "$round" "$one" "$rates" "$kept of $((4 * lines))"
        rm -f "$base/a/$plugin/one" "$base/a/$f"
    done
done
