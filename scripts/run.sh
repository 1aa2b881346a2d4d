#!/usr/bin/env bash
# The main job: build parcache and reproduce every published number it
# models, writing tables (text, JSON) and plots (SVG) to results/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release
target/release/parcache sim run all --out "${1:-results}"
