#!/usr/bin/env bash
# The demo (README): PP-OCRv4 rec on the project's text lines, as one ragged batch, one by
# one and naively padded, side by side. Extra arguments go to `tract-ragged demo`.
# The dev profile, as the tests build (dependencies optimised, Cargo.toml): after
# scripts/test.sh this compiles nothing of tract again, and the reverse.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-assets.sh >/dev/null
cargo run --quiet --bin tract-ragged -- demo "$@"
