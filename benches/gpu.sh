#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: the CUDA tests, the benchmark table
# (ragged-cuda against tract-cuda padded and one by one, and the CPU), PyTorch + cuDNN on
# the same lines, and a per-node profile of one batch of 32 on ragged-cuda.
#
# Here:  ../shared/gpu/bundle.sh --features cuda --test cuda
#        mkdir -p .gpu-extra && cp ../shared/gpu/torch_anchor.py .gpu-extra/ &&
#          pip download --no-deps onnx2torch==1.5.15 -d .gpu-extra
# There: bash benches/gpu.sh   (carrying .gpu-bundle, .gpu-extra, assets/ppocr, assets/onnx-node,
#        .gpu-cache once there is one)
# Logs land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
MODEL=assets/ppocr/ch_PP-OCRv4_rec_infer.onnx
RAGGED=(--ragged x:3 --input-fact N,3,48,W,f32)
step() { echo; echo "=== $* ($(date -u +%T))"; }

step gpu
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"

if [ "${SKIP_TESTS:-}" != 1 ]; then
  step tests
  timeout "${TEST_SECONDS:-330}" bash .gpu-bundle/run.sh tests ${TEST_FILTER:-} 2>&1 | tee "$OUT/tests.log" \
      | grep -E "^test |test result|panicked|relative|PP-OCR|out of memory|error|onnx conformance|FAILED|real models" | head -80
fi

step bench
timeout 150 bash .gpu-bundle/run.sh bin tract-ragged bench "$MODEL" "${RAGGED[@]}" --runtime cuda \
  --lines fixtures/lines --repeat 4 --batch 32 --runs 5 ${BENCH_CPU:---cpu} --save-samples /tmp/lines.npz 2>&1 | tee "$OUT/bench.log"

step torch
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl && \
  PYTHONPATH=/tmp/site timeout 120 python3 .gpu-extra/torch_anchor.py "$MODEL" /tmp/lines.npz 32 2>&1 | grep -v Warning | tee "$OUT/torch.log"

step profile
timeout 90 bash .gpu-bundle/run.sh bin tract-ragged profile "$MODEL" "${RAGGED[@]}" --runtime cuda \
  --widths 51,68,85,116,179,200,217,264,273,282,320,327,341,402,436,442,450,485,510,566,634,634,640,738,858,915,960,1052,1180,1213,1233,1324 \
  --runs 5 2>&1 | tee "$OUT/profile.log" | head -60

step latency
for w in 320x1 320x256; do
  timeout 60 bash .gpu-bundle/run.sh bin tract-ragged profile "$MODEL" "${RAGGED[@]}" --runtime cuda \
    --widths $w --runs 10 2>&1 | tail -1 | sed "s/^/$w: /" | tee -a "$OUT/latency.log"
done

tar -cf "$OUT/gpu-cache.tar" .gpu-cache 2>/dev/null
echo "done $(date -u +%T)"
