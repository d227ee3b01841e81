#!/usr/bin/env bash
# Fetch the test and demo assets into assets/ (gitignored): the PP-OCR models from the
# rapidocr-onnxruntime wheel, silero's voice-activity detectors from the silero-vad wheel
# (MIT), the ONNX backend node tests from the onnx wheel, and NVIDIA's NVRTC library from
# its wheel (the CUDA kernels' compiler, which needs no GPU: the tests compile every kernel
# file with it).
#
#   scripts/fetch-assets.sh            # idempotent: does nothing when assets/ is complete
#
# Wheels come from PyPI through `pip download --no-deps` and are checked against the sha256
# below before anything is extracted; a mismatch or a failed download stops with an error.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
assets="$top/assets"
wheels="$assets/wheels"
mkdir -p "$wheels"

RAPIDOCR=rapidocr_onnxruntime-1.4.4-py3-none-any.whl
RAPIDOCR_SHA=971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf
SILERO=silero_vad-6.2.3-py3-none-any.whl
SILERO_SHA=7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8
ONNX=onnx-1.17.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
ONNX_SHA=4a183c6178be001bf398260e5ac2c927dc43e7746e8638d6c05c20e321f8c949
NVRTC=nvidia_cuda_nvrtc-13.5.37-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
NVRTC_SHA=86b4d68058807988b7d9af5b44917a0601e9c337f35ccd657bfb3c759ff8d8bc

pip=(python3 -m pip)

fetch() { # $1 requirement, $2 wheel file name, $3 sha256, then pip platform flags
  local req=$1 file=$2 sha=$3
  shift 3
  if [ -f "$wheels/$file" ] && echo "$sha  $wheels/$file" | sha256sum -c --status; then
    return
  fi
  echo "fetching $req" >&2
  if ! "${pip[@]}" download --quiet --no-deps --only-binary=:all: "$@" -d "$wheels" "$req" >&2; then
    echo "error: could not download $req from PyPI (offline? a proxy?): the assets are needed by the tests and the demo" >&2
    exit 1
  fi
  if ! echo "$sha  $wheels/$file" | sha256sum -c --status; then
    echo "error: $wheels/$file does not have the expected sha256 $sha" >&2
    rm -f "$wheels/$file"
    exit 1
  fi
}

extract() { # $1 wheel, $2 prefix inside it, $3 destination folder
  python3 - "$1" "$2" "$3" <<'PY'
import os, sys, zipfile
wheel, prefix, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.is_dir() or not info.filename.startswith(prefix):
            continue
        target = os.path.join(dest, info.filename[len(prefix):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target + ".part", "wb") as out:
            out.write(src.read())
        os.replace(target + ".part", target)
PY
}

if [ ! -f "$assets/.ppocr-done" ]; then
  fetch rapidocr-onnxruntime==1.4.4 "$RAPIDOCR" "$RAPIDOCR_SHA"
  extract "$wheels/$RAPIDOCR" rapidocr_onnxruntime/models/ "$assets/ppocr"
  touch "$assets/.ppocr-done"
fi
if [ ! -f "$assets/.silero-done" ]; then
  fetch silero-vad==6.2.3 "$SILERO" "$SILERO_SHA"
  extract "$wheels/$SILERO" silero_vad/data/ "$assets/silero"
  touch "$assets/.silero-done"
fi
if [ ! -f "$assets/.onnx-node-done" ]; then
  fetch onnx==1.17.0 "$ONNX" "$ONNX_SHA" --python-version 3.11 --implementation cp \
    --abi cp311 --platform manylinux_2_17_x86_64
  extract "$wheels/$ONNX" onnx/backend/test/data/node/ "$assets/onnx-node"
  touch "$assets/.onnx-node-done"
fi
if [ ! -f "$assets/.nvrtc-done" ]; then
  fetch nvidia-cuda-nvrtc==13.5.37 "$NVRTC" "$NVRTC_SHA" --platform manylinux2010_x86_64
  extract "$wheels/$NVRTC" nvidia/cu13/lib/ "$assets/nvrtc"
  touch "$assets/.nvrtc-done"
fi
ls "$assets/ppocr" "$assets/silero"
echo "onnx node cases: $(ls "$assets/onnx-node" | wc -l)"
