#!/usr/bin/env bash
# tract's own CLI (built by scripts/tract-cli.sh) on a ragged PP-OCRv4 rec batch, checked
# against tract-ragged: the model widened (`tract-ragged widen`), the `ragged` transform
# from `-t` with the batch's widths, a profiled dump, then `run` with the outputs saved,
# each line's valid columns compared with `tract-ragged run` on the same lines cropped.
#
#   scripts/tract-cli-check.sh TRACT [RUNTIME]      # RUNTIME: cpu (default) or ragged-cuda
set -euo pipefail
cd "$(dirname "$0")/.."
tract=$1
runtime=${2:-cpu}
# TRACT_RAGGED: how to call tract-ragged (a command of several words allowed).
read -r -a bin <<<"${TRACT_RAGGED:-target/debug/tract-ragged}"
rec=assets/ppocr/ch_PP-OCRv4_rec_infer.onnx
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"${bin[@]}" widen "$rec" "$work/rec-wide.onnx" >/dev/null
python3 - "$work" <<'PY'
import sys
import numpy as np
work = sys.argv[1]
rng = np.random.default_rng(1)
widths = [51, 200, 320]
lines = [rng.standard_normal([3, 48, w]).astype(np.float32) for w in widths]
batch = np.zeros([len(widths), 3, 48, max(widths)], np.float32)
for k, line in enumerate(lines):
    batch[k, :, :, : line.shape[2]] = line
np.savez(f"{work}/batch.npz", x=batch)
np.savez(f"{work}/lines.npz", **{f"s{k}": line for k, line in enumerate(lines)})
PY
flags=(--onnx-ignore-output-shapes -i N,3,48,W,f32
  -t 'ragged(input: "x", axis: 3, widths: [51, 200, 320])' -r "$runtime")
[ "$runtime" = ragged-cuda ] && flags+=(--cuda)

"$tract" "$work/rec-wide.onnx" "${flags[@]}" dump --profile --input-from-npz "$work/batch.npz" \
  >"$work/profile.txt" 2>&1 || { tail -20 "$work/profile.txt"; exit 1; }
grep -q "RaggedMask" "$work/profile.txt"
grep -q "Entire network performance" "$work/profile.txt"
"$tract" "$work/rec-wide.onnx" "${flags[@]}" run --input-from-npz "$work/batch.npz" \
  --save-outputs "$work/tract-out.npz" >"$work/run.txt" 2>&1 || { tail -20 "$work/run.txt"; exit 1; }
cuda=cpu
[ "$runtime" = ragged-cuda ] && cuda=cuda
"${bin[@]}" run "$rec" --ragged x:3 --input-fact N,3,48,W,f32 --runtime "$cuda" \
  --samples "$work/lines.npz" --out "$work/ours.npz"
python3 - "$work" <<'PY'
import sys
import numpy as np
work = sys.argv[1]
theirs = np.load(f"{work}/tract-out.npz")
ours = np.load(f"{work}/ours.npz")
probs = theirs[sorted(theirs.files)[0]]  # [N, T, classes], the padded batch
worst = 0.0
for k in range(probs.shape[0]):
    mine = ours[f"s{k}_o0"]
    worst = max(worst, float(np.abs(probs[k, : mine.shape[0]] - mine).max()))
print(f"tract's CLI, -t ragged: {probs.shape[0]} lines against tract-ragged run: max difference {worst:.2e}")
sys.exit(0 if worst <= 1e-4 else 1)
PY
