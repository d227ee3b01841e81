#!/usr/bin/env bash
# The test command (README, CI): fetch the assets, then run every test on the CPU. Tests
# that need a CUDA device are marked ignored and reported as such; run them on a GPU
# machine with ../shared/gpu/bundle.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-assets.sh >/dev/null
cargo test --all-targets "$@"
cargo test --doc "$@"
