#!/usr/bin/env bash
# The test command (README, CI): fetch the assets, then run every test on the CPU and the
# tract-crate example. Tests that need a CUDA device are marked ignored and reported as
# such (the onnx_conformance target says so in its summary lines); run them on a GPU
# machine with ../shared/gpu/bundle.sh and benches/gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-assets.sh >/dev/null
cargo test --all-targets "$@"
cargo test --doc "$@"
cargo run --quiet --example tract_api
# Ragged batches against ONNX Runtime one sample at a time (random models, PP-OCR lines).
scripts/ort_models.sh
