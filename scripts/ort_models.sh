#!/usr/bin/env bash
# Cross-check `tract-ragged run` (ragged batches) against ONNX Runtime run on each sample
# alone, on the random models of every op family the transform handles (CRNNs with LSTM,
# GRU and RNN layers among them), on PyTorch's CRNN exports (fixtures/rnn), on the token
# encoders of fixtures/encoders, on silero's voice-activity detectors and on PP-OCRv4 rec
# over the fixture lines. Part of the test command (scripts/test.sh).
#
#   scripts/ort_models.sh [--release] [--runtime cuda]
#
# Installs onnxruntime (pinned) with pip when Python cannot import it. Each model must
# match within 1e-4 (relative to max(1, |reference|)) or be refused with a clear error
# (a sample narrower than the model's receptive field); models ONNX Runtime itself cannot
# run are counted apart. PP-OCR lines must give the same CTC text; their probabilities are
# compared within 1e-3: tract alone, one sample at a time, already differs from ONNX
# Runtime by up to 3.2e-4 on these lines (ONNX Runtime from itself, optimised or not, by
# 8.9e-5), float rounding amplified through ~200 layers.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=() bin=target/debug/tract-ragged runtime=cpu
while [ $# -gt 0 ]; do
  case $1 in
    --release) profile=(--release) bin=target/release/tract-ragged ;;
    --runtime) runtime=$2; shift ;;
    *) echo "usage: $0 [--release] [--runtime cpu|cuda]" >&2; exit 2 ;;
  esac
  shift
done

python3 -c 'import onnxruntime, numpy, PIL' 2>/dev/null ||
  python3 -m pip install --quiet onnxruntime==1.32.0 numpy pillow==13.0.0 >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo run --quiet "${profile[@]}" --example export_models -- "$work" 80 32
cargo build --quiet "${profile[@]}" --bin tract-ragged

matched=0 narrow=0 ort_cannot=0 failed=0
for dir in "$work"/models/*/; do
  name=$(basename "$dir")
  if ! "$bin" run "$dir/model.onnx" --ragged x:3 --input-fact "$(cat "$dir/fact")" \
      --runtime "$runtime" --samples "$dir/samples.npz" --out "$dir/out.npz" 2>"$dir/err"; then
    if grep -q "too narrow" "$dir/err"; then
      narrow=$((narrow + 1))
    else
      echo "model $name: $(cat "$dir/err")"
      failed=$((failed + 1))
    fi
    continue
  fi
  rc=0
  axes=$(cat "$dir/batch_axes" 2>/dev/null || true)
  reference=$dir/model.onnx
  [ -f "$dir/reference.onnx" ] && reference=$dir/reference.onnx
  report=$(python3 scripts/ort_check.py "$reference" "$dir/samples.npz" "$dir/out.npz" \
    --batch-axes "$axes") || rc=$?
  case $rc in
    0) matched=$((matched + 1)) ;;
    2) ort_cannot=$((ort_cannot + 1)) ;;
    *) echo "model $name: $report"; failed=$((failed + 1)) ;;
  esac
done
echo "ort models ($runtime): $matched matched, $narrow refused (samples too narrow), $ort_cannot that ONNX Runtime cannot run, $failed failed"

# One model on one archive: `tract-ragged run`, then ONNX Runtime one sample at a time.
#   ort_case NAME MODEL RAGGED FACT SAMPLES [NOTE]
ort_case() {
  local name=$1 model=$2 ragged=$3 fact=$4 samples=$5 note=${6:-} rc=0 report
  "$bin" run "$model" --ragged "$ragged" --input-fact "$fact" --runtime "$runtime" \
    --samples "$samples" --out "$work/$name-out.npz"
  report=$(python3 scripts/ort_check.py "$model" "$samples" "$work/$name-out.npz") || rc=$?
  echo "ort $name$note ($runtime): $report"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

# CRNNs exported by PyTorch (benches/crnn.py): BiLSTM sequence first, BiGRU batch first.
for crnn in fixtures/rnn/*.onnx; do
  ort_case "$(basename "$crnn" .onnx)" "$crnn" x:3 N,3,48,W,f32 "$work/lines/samples.npz"
done

# Token encoders (scripts/token_encoders.py, fixtures/encoders): ids gathered from an
# embedding table, positions from the input's shape, attention, pooling; [batch, sequence]
# in the models, N,L given.
for dir in fixtures/encoders/encoder_*/; do
  ort_case "$(basename "$dir")" "$dir/model.onnx" input_ids:1 N,L,i64 "$dir/samples.npz"
done

# Models of several inputs: arrays s{i}.{input} per sample, shared.{input} once.
python3 - "$work" <<'PY'
import os, sys
import numpy as np
work, rng = sys.argv[1], np.random.default_rng(3)
d = {}
for i, n in enumerate([1, 5, 12, 33, 20]):
    d[f"s{i}.input_ids"] = rng.integers(0, 50, [n]).astype(np.int64)
    mask = np.ones([n], np.int64)
    mask[max(1, n - n // 4):] = 0
    d[f"s{i}.attention_mask"] = mask
    d[f"s{i}.token_type_ids"] = (np.arange(n) >= n // 2).astype(np.int64)
np.savez(os.path.join(work, "masked_encoder.npz"), **d)
# RoBERTa's inputs: no token types, the pad id (1) where the mask is 0.
r = {k: v.copy() for k, v in d.items() if not k.endswith("token_type_ids")}
for i in range(5):
    r[f"s{i}.input_ids"][r[f"s{i}.attention_mask"] == 0] = 1
np.savez(os.path.join(work, "roberta.npz"), **r)
d = {"shared.gain": np.array(1.25, np.float32)}
for i, t in enumerate([1, 4, 17, 9]):
    d[f"s{i}.x"] = rng.standard_normal([t, 4]).astype(np.float32)
    d[f"s{i}.state"] = rng.standard_normal([8]).astype(np.float32)
np.savez(os.path.join(work, "stateful.npz"), **d)
d = {}
for i, t in enumerate([1, 5, 17, 9]):
    d[f"s{i}.x"] = rng.standard_normal([t, 4]).astype(np.float32)
    d[f"s{i}.h0"] = rng.standard_normal([1, 8]).astype(np.float32)
    d[f"s{i}.c0"] = rng.standard_normal([1, 8]).astype(np.float32)
np.savez(os.path.join(work, "lstm_state.npz"), **d)
PY
ort_case masked_encoder fixtures/encoders/masked_encoder/model.onnx input_ids:1 N,L,i64 \
  "$work/masked_encoder.npz" ", several inputs"
# BERTs as torch.onnx.export writes Hugging Face's BertModel (eager and SDPA attention),
# on the same sequences.
for bert in hf_bert hf_bert_sdpa; do
  ort_case "$bert" "fixtures/encoders/$bert/model.onnx" input_ids:1 N,L,i64 \
    "$work/masked_encoder.npz" ", several inputs"
done
# RoBERTa: positions numbered by a CumSum over the ids that are not the pad id.
ort_case hf_roberta fixtures/encoders/hf_roberta/model.onnx input_ids:1 N,L,i64 \
  "$work/roberta.npz" ", several inputs"
ort_case stateful fixtures/encoders/stateful/model.onnx x:1 N,T,4,f32 "$work/stateful.npz" \
  ", several inputs"
# An LSTM given its initial state per sample ([1, N, H] inputs), as a VAD carries its own.
ort_case lstm_state fixtures/encoders/lstm_state/model.onnx x:1 N,T,4,f32 \
  "$work/lstm_state.npz" ", several inputs"

# silero's voice-activity detectors (assets/silero, from the silero-vad wheel): If nodes on
# shapes and on the sample rate, a reflect pad after the chunk, the state [2, N, 128] per
# stream; chunks of several lengths (with and without their context) in one batch, at
# 16 and 8 kHz (`shared.sr`, folded into the model before it is typed).
python3 - "$work" <<'PY'
import os, sys
import numpy as np
work, rng = sys.argv[1], np.random.default_rng(4)
for sr, lengths in [(16000, [576, 512, 576, 640, 300]), (8000, [288, 256, 288, 320, 200])]:
    d = {"shared.sr": np.array(sr, np.int64)}
    for i, n in enumerate(lengths):
        d[f"s{i}.input"] = rng.uniform(-0.5, 0.5, [n]).astype(np.float32)
        d[f"s{i}.state"] = rng.uniform(-0.5, 0.5, [2, 128]).astype(np.float32)
    np.savez(os.path.join(work, f"vad{sr}.npz"), **d)
    del d["shared.sr"]
    np.savez(os.path.join(work, f"vad{sr}-no-sr.npz"), **d)
PY
for case in silero_vad:16000 silero_vad:8000 silero_vad_16k_op15:16000 silero_vad_op18_ifless:16000 \
    silero_vad_op18_ifless:8000 silero_vad_half:16000-no-sr; do
  vad=${case%%:*} samples=$work/vad${case#*:}.npz rc=0
  "$bin" run "assets/silero/$vad.onnx" --ragged input:1 --input-fact input=N,L,f32 \
    --input-fact state=2,N,128,f32 --runtime "$runtime" --samples "$samples" \
    --out "$work/$vad-out.npz"
  report=$(python3 scripts/ort_check.py "assets/silero/$vad.onnx" "$samples" "$work/$vad-out.npz" \
    --input-batch-axes state=1 --batch-axes 0,1) || rc=$?
  echo "ort $vad at ${case#*:} ($runtime), several inputs: $report"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
done

rec=assets/ppocr/ch_PP-OCRv4_rec_infer.onnx
"$bin" run "$rec" --ragged x:3 --input-fact N,3,48,W,f32 --runtime "$runtime" \
  --samples "$work/lines/samples.npz" --out "$work/lines/out.npz"
lines_rc=0
report=$(python3 scripts/ort_check.py --ctc --tol 1e-3 "$rec" "$work/lines/samples.npz" \
  "$work/lines/out.npz") || lines_rc=$?
echo "ort PP-OCRv4 rec ($runtime): $report"

# PP-OCRv4 det on the fixture pages (PP-OCR det's preprocessing), H and W ragged, and W
# ragged at a fixed H (the pages cut to their top 320 rows). The bound is tract's, as for
# rec: tract run one page at a time differs from ONNX Runtime by up to 6.1e-4 there.
python3 - "$work" <<'PY'
import os, sys
import numpy as np
from PIL import Image
work = sys.argv[1]
mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
pages = {}
for name in sorted(os.listdir("fixtures/pages")):
    rgb = np.asarray(Image.open(os.path.join("fixtures/pages", name)).convert("RGB"), np.float32)
    bgr = rgb[:, :, ::-1].transpose(2, 0, 1) / 255.0
    pages[name[:-4]] = ((bgr - mean) / std).astype(np.float32)
np.savez(os.path.join(work, "pages.npz"), **pages)
np.savez(os.path.join(work, "pages320.npz"), **{k: v[:, :320, :] for k, v in pages.items()})
PY
det=assets/ppocr/ch_PP-OCRv4_det_infer.onnx
det_rc=0
for case in "x:2,3 N,3,H,W,f32 pages" "x:3 N,3,320,W,f32 pages320"; do
  set -- $case
  "$bin" run "$det" --ragged "$1" --input-fact "$2" --runtime "$runtime" \
    --samples "$work/$3.npz" --out "$work/$3-out.npz"
  report=$(python3 scripts/ort_check.py --tol 1e-3 "$det" "$work/$3.npz" "$work/$3-out.npz") \
    || det_rc=$?
  echo "ort PP-OCRv4 det, ragged $1 ($runtime): $report"
done
[ "$failed" -eq 0 ] && [ "$lines_rc" -eq 0 ] && [ "$det_rc" -eq 0 ]
