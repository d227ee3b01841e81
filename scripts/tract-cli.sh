#!/usr/bin/env bash
# tract's own CLI (tract-cli 0.23.9, the `tract` binary) with tract-ragged linked: its
# runtime `ragged-cuda` in `tract list-runtimes` and `-r ragged-cuda`, its transform in
# `-t 'ragged(input: "x", axis: 3)'`.
#
#   scripts/tract-cli.sh [--no-cuda] [OUT_DIR]     # default OUT_DIR: target/tract-cli
#
# TRACT_CLI_FEATURES picks tract-cli's features (default: its own defaults, every
# format it reads; `onnx` builds the ONNX-only CLI in a third of the time).
#
# tract-cli is a binary crate, so nothing can depend on it: this fetches its published
# source (sha256-checked against the registry's index), adds tract-ragged as a path
# dependency with the CUDA features aligned (tract-cli's `cuda-13000` and ours, or neither
# with --no-cuda), and one line in its main.rs that references tract-ragged, so that the
# linker keeps the registrations tract finds at run time (tract's runtimes and transforms
# are `inventory` entries: an unreferenced crate's are dropped). Nothing of tract-cli's
# source is kept in this repository. The binary lands in OUT_DIR/tract.
#
# Then, for instance (PP-OCR's exports need their int32 shape casts widened first):
#   tract-ragged widen rec.onnx rec-wide.onnx
#   OUT_DIR/tract rec-wide.onnx -i N,3,48,W,f32 \
#     -t 'ragged(input: "x", axis: 3, widths: [51, 320, 1324])' -r ragged-cuda \
#     dump --profile --cost --input-from-npz batch.npz
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
version=0.23.9
sha256=78724838981f6afb8b529d28a0be86ae647cf104090102031e4b35c22edfd9b9
cuda=1
if [ "${1:-}" = "--no-cuda" ]; then
  cuda=0
  shift
fi
out=${1:-$top/target/tract-cli}
mkdir -p "$out"
out=$(cd "$out" && pwd)
crate="$out/tract-cli-$version.crate"
src="$out/tract-cli-$version"

if [ ! -f "$crate" ] || ! echo "$sha256  $crate" | sha256sum -c --quiet - 2>/dev/null; then
  url="https://static.crates.io/crates/tract-cli/tract-cli-$version.crate"
  if command -v curl >/dev/null; then
    curl -sSfL --retry 3 -o "$crate.partial" "$url"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$url" "$crate.partial"
  fi
  echo "$sha256  $crate.partial" | sha256sum -c --quiet -
  mv "$crate.partial" "$crate"
fi
rm -rf "$src"
tar -xzf "$crate" -C "$out"

# tract-ragged beside tract-cli's own dependencies (the same tract crates, =0.23.9), and
# its features following tract-cli's: without CUDA, neither builds tract-cuda.
if [ "$cuda" = 1 ]; then
  ragged_features='features = ["cuda"]'
  case "${TRACT_CLI_FEATURES:-}" in
    "") cli_features=() ;;
    *) cli_features=(--no-default-features --features "$TRACT_CLI_FEATURES,cuda-13000") ;;
  esac
else
  ragged_features='features = []'
  cli_features=(--no-default-features --features
    "${TRACT_CLI_FEATURES:-onnx,tf,pulse,pulse-opl,tflite,transformers,extra}")
fi
python3 - "$src/Cargo.toml" "$top" "$ragged_features" <<'PY'
import sys
path, top, features = sys.argv[1:]
toml = open(path).read()
marker = "[dependencies.box_drawing]"
assert marker in toml, "tract-cli's Cargo.toml changed: no " + marker
dep = f'[dependencies.tract-ragged]\npath = "{top}"\ndefault-features = false\n{features}\n\n'
open(path, "w").write(toml.replace(marker, dep + marker, 1))
PY
python3 - "$src/src/main.rs" <<'PY'
import sys
path = sys.argv[1]
main = open(path).read()
marker = "fn main() -> TractResult<()> {"
assert marker in main, "tract-cli's main.rs changed: no " + marker
link = "    tract_ragged::link();\n"
open(path, "w").write(main.replace(marker, marker + "\n" + link, 1))
PY

# Its own target folder: tract-cli's dependencies differ from ours (reqwest, the
# TensorFlow and TFLite loaders), and its lock file is resolved afresh within the
# versions its Cargo.toml pins.
cargo build --release --manifest-path "$src/Cargo.toml" --target-dir "$out/target" \
  "${cli_features[@]}"
cp "$out/target/release/tract" "$out/tract"
echo "$out/tract"
