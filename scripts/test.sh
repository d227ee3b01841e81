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
# The API's docs build without a warning (broken or private links among them).
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps "$@"
cargo run --quiet --example tract_api
# As a library (no CLI): builds, and without the CLI's dependencies.
cargo build --quiet --lib --no-default-features --features cuda
# ragged-cuda's unit tests that need no device (kernel sources compiled by NVRTC, from the
# assets, fast division).
LD_LIBRARY_PATH="$PWD/assets/nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TRACT_RAGGED_NEED_NVRTC=1 \
  cargo test --quiet --lib --no-default-features --features cuda
if cargo tree -e normal --no-default-features --features cuda | grep -E "^[│├└ ]*(clap|indicatif|png|ndarray-npy) "; then
  echo "the library pulls in the CLI's dependencies" >&2
  exit 1
fi
# Ragged batches against ONNX Runtime one sample at a time (random models, PP-OCR lines).
scripts/ort_models.sh
# The exporters' zoos, one by one and ragged against ONNX Runtime: a model that runs must
# match; refusals are listed. fixtures/zoo: 102 small models of transformers, torchaudio
# and torchvision as both torch exporters write them (scripts/zoo/export.py);
# ../shared/zoo: 20 more, kept beside the repository. What each is expected to refuse,
# and why: fixtures/zoo/refused.json, fixtures/zoo/shared-refused.json.
python3 scripts/zoo_check.py fixtures/zoo
if [ -d ../shared/zoo ]; then
  python3 scripts/zoo_check.py ../shared/zoo --refused fixtures/zoo/shared-refused.json
fi
# The Python package (python/): its wheel built by maturin against the same compiled
# tract, installed in a venv, its tests run (pytest), a local Ray cluster among them.
scripts/python.sh
# tract's own CLI with tract-ragged linked (scripts/tract-cli.sh: tract-cli 0.23.9 from the
# registry, here ONNX only), profiling and running a ragged batch through
# `-t 'ragged(...)'`, against `tract-ragged run` on the same lines. Built with CUDA, as the
# tests build tract, so that it links their compiled tract; the check runs on the CPU, and
# the GPU machine runs it on ragged-cuda (`scripts/tract-cli-check.sh TRACT ragged-cuda`).
TRACT_CLI_FEATURES=onnx scripts/tract-cli.sh >/dev/null
scripts/tract-cli-check.sh target/tract-cli/tract
