#!/usr/bin/env bash
# tract's own CLI (tract-cli 0.23.9, the `tract` binary) with tract-ragged linked: its
# runtime `ragged-cuda` in `tract list-runtimes` and `-r ragged-cuda`, its transform in
# `-t 'ragged(input: "x", axis: 3)'`.
#
#   scripts/tract-cli.sh [--no-cuda] [--release] [OUT_DIR]  # default OUT_DIR: target/tract-cli
#
# TRACT_CLI_FEATURES picks tract-cli's features (default: its own defaults, every
# format it reads; `onnx` builds the ONNX-only CLI).
#
# tract-cli is a binary crate, so nothing can depend on it: this fetches its published
# source (sha256-checked against the registry's index), adds tract-ragged as a path
# dependency with the CUDA features aligned (tract-cli's `cuda-13000` and ours, or neither
# with --no-cuda), and one line in its main.rs that references tract-ragged, so that the
# linker keeps the registrations tract finds at run time (tract's runtimes and transforms
# are `inventory` entries: an unreferenced crate's are dropped). Nothing of tract-cli's
# source is kept in this repository. The binary lands in OUT_DIR/tract.
#
# It builds in our target folder, with our lock file, our profiles and our patches of
# tract (patches/), so that it links
# the tract the tests compiled instead of compiling it again: for that, the features tract's
# crates get must be the same in both builds. Two of tract-cli's are left out here for it:
# tract-core's `deploy` (its `deploy` runtime) and tract-linalg's `foreign-inventory` (the
# other architectures' kernels in `tract routines`); Cargo.toml pins the others.
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
cuda=1 profile=dev
while [ $# -gt 0 ]; do
  case $1 in
    --no-cuda) cuda=0 ;;
    --release) profile=release ;;
    -*) echo "usage: $0 [--no-cuda] [--release] [OUT_DIR]" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
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
# Unpacked and patched beside the copy in use, which is kept when nothing changed: its
# files' times are then the same and cargo does not rebuild tract-cli.
rm -rf "$out/new"
mkdir -p "$out/new"
tar -xzf "$crate" -C "$out/new"

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
python3 - "$out/new/tract-cli-$version" "$top" "$ragged_features" <<'PY'
import re, sys
src, top, features = sys.argv[1:]
path = src + "/Cargo.toml"
toml = open(path).read()

def replace(old, new):
    global toml
    assert old in toml, "tract-cli's Cargo.toml changed: no " + old
    toml = toml.replace(old, new, 1)

marker = "[dependencies.box_drawing]"
dep = f'[dependencies.tract-ragged]\npath = "{top}"\ndefault-features = false\n{features}\n\n'
replace(marker, dep + marker)
replace('[dependencies.tract-core]\nversion = "=0.23.9"\nfeatures = ["deploy"]\n',
        '[dependencies.tract-core]\nversion = "=0.23.9"\n')
replace('[target.\'cfg(target_arch = "x86_64")\'.dependencies.tract-linalg]\n'
        'version = "=0.23.9"\nfeatures = ["foreign-inventory"]\n', '')
# Our profiles (the dependencies' settings are part of what cargo compares).
ours = open(top + "/Cargo.toml").read()
sections = re.split(r"(?m)^(?=\[)", ours)
profiles = "".join(s for s in sections if s.startswith("[profile."))
toml = re.sub(r"(?ms)^\[profile\..*?(?=^\[(?!profile\.)|\Z)", "", toml)
toml += "\n" + profiles
# Our patched tract crates (patches/), with their paths from our folder.
patches = "".join(s for s in sections if s.startswith("[patch."))
toml += "\n" + re.sub(r'path = "(?!/)', f'path = "{top}/', patches)
# Our build-dependencies' pins: the features of host crates (syn's), so that tract's proc
# macros, and all of tract above them, are the tests' compiled ones. Not the optional ones
# (our build script's, for the server).
build = "".join(s for s in sections if s.startswith("[build-dependencies]"))
toml += "\n" + "".join(l for l in build.splitlines(True) if "optional = true" not in l)
# Its own workspace: it lies under ours (target/), which would otherwise claim it.
toml += "\n[workspace]\n"
open(path, "w").write(toml)

path = src + "/src/main.rs"
main = open(path).read()
marker = "fn main() -> TractResult<()> {"
assert marker in main, "tract-cli's main.rs changed: no " + marker
link = "    tract_ragged::link();\n"
open(path, "w").write(main.replace(marker, marker + "\n" + link, 1))
PY
# Our lock file: the same versions of every crate the two builds share.
cp "$top/Cargo.lock" "$out/new/tract-cli-$version/Cargo.lock"
if [ -d "$src" ] && diff -rq -x Cargo.lock "$src" "$out/new/tract-cli-$version" >/dev/null; then
  cp "$top/Cargo.lock" "$src/Cargo.lock"
else
  rm -rf "$src"
  mv "$out/new/tract-cli-$version" "$src"
fi
rm -rf "$out/new"

# The dev profile by default, as the tests (dependencies optimised), `--release` as
# `cargo build --release`.
cargo build --manifest-path "$src/Cargo.toml" --target-dir "$top/target" --profile "$profile" \
  "${cli_features[@]}"
cp "$top/target/$([ "$profile" = dev ] && echo debug || echo release)/tract" "$out/tract"
echo "$out/tract"
