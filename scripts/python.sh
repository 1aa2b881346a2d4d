#!/usr/bin/env bash
# Builds and installs parcache's Python package (crates/py) into a virtual
# environment under target/py-venv (in $CARGO_TARGET_DIR if set) with pip,
# as a user would (`pip install ./crates/py`), then runs its tests beside
# the command line `cargo test` built. Called by scripts/test.sh; maturin
# and pandas come from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
venv=$target/py-venv
# Debian's own interpreter (python3-venv from scripts/apt-packages.txt).
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if [ ! -x "$venv/bin/python" ]; then
  echo "python: making $venv"
  "$py" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import maturin, pandas" 2>/dev/null; then
  echo "python: installing maturin and pandas into $venv (once)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "maturin>=1.5,<2" pandas
fi
echo "python: pip install ./crates/py"
# Built with the package's own `py` profile (Cargo.toml): optimized,
# without release's whole-program LTO.
PATH="$venv/bin:$PATH" "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./crates/py
# The command line the tests compare with: `cargo test`'s build of it
# (`cargo test --workspace` builds it for the command line's tests; asking
# for it so, rather than `cargo build -p parcache-cli`, takes it as built,
# where the narrower feature set of a build of one package compiled the
# command line and its dependencies again).
cargo test --workspace --locked --no-run --quiet
PARCACHE_BIN="$target/debug/parcache" "$venv/bin/python" crates/py/tests/test_parcache.py
