#!/usr/bin/env bash
# The test suite: formatting, lints, and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# The Python package, installed with pip into target/py-venv (its tests
# print unittest's summary; a failure stops the suite here).
scripts/python.sh 2>&1 | tee -a "$log"
# One closing line for the whole suite (cargo's own last line is the doc-test runner's).
awk '/^test result:/ { p += $4; f += $6 } /^Ran [0-9]+ tests? in/ { py = $2 } END { printf "total: %d passed, %d failed\n", p + py, f; exit (f > 0) }' "$log"
